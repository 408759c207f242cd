# The next GPU call (nvidia-h200-x2), for what this session changed without a GPU left to test it on:
# the host path's plain ceil-division and cached views (every symm op), SwiGLU stage-0 tails (off).
#   mkdir devrun; cp bench/results/2026-11-30_h200x2_session6/commands/dev_run.sh bench/results/2026-11-30_h200x2_session11/commands/next.sh devrun/
#   DEADLINE=560 bash devrun/dev_run.sh devrun/next.sh
TAILN=6 run t_ops 150 env OVERLAP_TEST_TIMEOUT_S=140 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "fast_triton_launch or (ws2 and repeated_calls and symm and not peer)"
TAILN=8 run t_cta 170 env OVERLAP_TEST_TIMEOUT_S=160 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_cta.py -k "ws2"
TAILN=14 run bench_swiglu 100 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_cta.py --sizes 512,1024,4096 --acts swiglu --k-chunks 4 --transports ce --micro-batches 2 --swiglu-tails off,on --out-dir $RES
TAILN=10 run probe 100 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_cta.py --sizes 512,1024 --gpu-bound --host-breakdown --op-variants tail4096,tail6144
