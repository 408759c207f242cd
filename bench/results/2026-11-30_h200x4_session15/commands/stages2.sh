# Call 2 on nvidia-h200-x4: issue 6's bar (Llama TP+SP training at ws 4), issue 8's (the TP block with fused epilogues), issue 5's at 4 GPUs (2 stages x TP2 against TP4).
TAILN=25 run models4 200 python -m torch.distributed.run --standalone --nproc-per-node=4 bench/bench_models.py --out $RES --sections llama --variants inductor,async_tp,overlap
TAILN=25 run models4_g 150 python -m torch.distributed.run --standalone --nproc-per-node=4 bench/bench_models.py --out $RES --mode reduce-overhead --sections llama --variants inductor,async_tp,overlap
TAILN=25 run cta4 160 python -m torch.distributed.run --standalone --nproc-per-node=4 bench/bench_cta.py --sizes 512,1024,4096 --graphs --out-dir $RES
