# Call 4, nvidia-h200-x2: ag_mm's new cuBLAS-per-chunk path (symm_lowering.AG_MM_GEMM): GPU numerics, 100 repeated
# calls, captured replays; then the probe of both GEMM paths (eager, host, replayed) at DESIGN.md's shapes and the
# Llama step's (MLP up: 2 weights of 7168; QKV: 3 of 1024 at ws 2).
TAILN=8 run t_ag 230 env OVERLAP_TEST_TIMEOUT_S=220 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "(ws2 and agcublas) or captured_symm_ops_replay"
TAILN=12 run probe_ag 240 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_symm.py --ops ag_mm --ag-shapes 4096x8192x7168,8192x8192x7168,16384x8192x2048,8192x4096x14336x2,8192x4096x3072x3,512x8192x7168
