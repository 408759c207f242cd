# The next GPU call (nvidia-h200-x2), for what this session changed after the 2-GPU machine was
# withdrawn (status listed only nvidia-h200), all off by default and CPU-tested:
#  - the SwiGLU share in whole rounds (cta_symm.SWIGLU_SHARE_ROUNDS);
#  - stage 0's staged tiles stored by TMA (cta_symm.STAGE0_TMA_STORE; each tile counted after its bulk
#    store completed: cp.async.bulk.wait_group 0 + fence.proxy.async, then the release).
# The GPU test turns each on for its cases (and runs the repeated calls with TMA stores); probe_ws
# times stage 0 alone with and without TMA stores (one GPU); probe_cta the whole op (`tma`).
#   mkdir devrun; cp bench/results/2026-11-30_h200x2_session6/commands/dev_run.sh bench/results/2026-11-30_h200x2_session12/commands/next.sh devrun/
#   DEADLINE=560 bash devrun/dev_run.sh devrun/next.sh
TAILN=8 run t_cta 240 env OVERLAP_TEST_TIMEOUT_S=230 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_cta.py -k "ws2 and (numerics or graphs)"
TAILN=12 run probe_ws 60 python bench/probe_ws.py --shapes 1024x8192x28672,512x8192x28672,4096x8192x28672 --configs 128x256x64x3x8 --gelu --stage0
TAILN=12 run probe 120 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_cta.py --sizes 512,1024,4096 --gpu-bound --op-variants tma
TAILN=20 run bench 100 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_cta.py --sizes 512,1024,4096 --acts swiglu --k-chunks 4 --transports ce --micro-batches 2 --swiglu-shares work,rounds --out-dir $RES
