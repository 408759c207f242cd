TAILN=14 run epi_train_g 200 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_epilogue.py --out-dir $RES --block tp --mode train --cudagraphs --verbose
TAILN=14 run epi_inf_g 120 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_epilogue.py --out-dir $RES --block tp --mode inference --cudagraphs --verbose
TAILN=10 run cta_small 80 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_cta.py --sizes 16,128 --acts gelu,swiglu --k-chunks 4 --transports ce --micro-batches 2,4 --graphs --out-dir $RES
TAILN=20 run models_g 170 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_models.py --out $RES --mode reduce-overhead --sections llama --variants inductor,overlap --quick
