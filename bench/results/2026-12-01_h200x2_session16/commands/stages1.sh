# Call 1, nvidia-h200-x2 (x4 not lent): mm_rs / mm_ar at ws 4's local problems (cuBLAS bands vs the kernel below
# RS_CUBLAS_MIN_K; cuBLAS rounds vs the kernel for mm_ar); the fifteenth session's cost-model change for CUDA graphs
# on GPU (Llama step under graphs: how many rewrites now); the reduce-overhead GPU tests.
TAILN=14 run probe_rs 200 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_symm.py --ops mm_rs,mm_ar --rs-shapes 2048x3584x8192,4096x3584x8192,8192x1024x8192 --ar-shapes 4096x7168x8192,8192x7168x8192
TAILN=20 run models2_g 130 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_models.py --out $RES --mode reduce-overhead --sections llama --variants inductor,overlap
TAILN=6 run t_ro 200 env OVERLAP_TEST_TIMEOUT_S=190 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "(reduce_overhead and ws2 and capture_symm) or reduce_overhead_training"
