# Call 5, nvidia-h200-x2: ag_mm on cuBLAS per chunk by default (AG_MM_GEMM): the Llama step under CUDA graphs (cost
# model on, then off: every match rewritten), and the ag_mm suite eager + replayed (a second sample of the probe).
TAILN=14 run models2_g 130 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_models.py --out $RES --mode reduce-overhead --sections llama --variants inductor,overlap
TAILN=14 run models2_g_off 130 env OVERLAP_COST_MODEL=off python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_models.py --out $RES/cost_model_off --mode reduce-overhead --sections llama --variants inductor,overlap
TAILN=30 run bench_ag 150 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_collective_gemm.py --suite ag_mm --lowerings symm --graphs --out-dir $RES
