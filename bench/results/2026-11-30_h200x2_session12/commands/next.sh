# The next GPU call (nvidia-h200-x2), for what this session changed after the 2-GPU machine was
# withdrawn (status listed only nvidia-h200): the SwiGLU share in whole rounds (cta_symm.SWIGLU_SHARE_ROUNDS,
# off), correctness with it on (the GPU test turns it on for its SwiGLU cases, one of which, M=640
# F=16384, takes another share at 2 GPUs) and its time against the balanced-work share.
#   mkdir devrun; cp bench/results/2026-11-30_h200x2_session6/commands/dev_run.sh bench/results/2026-11-30_h200x2_session12/commands/next.sh devrun/
#   DEADLINE=330 bash devrun/dev_run.sh devrun/next.sh
TAILN=8 run t_cta 200 env OVERLAP_TEST_TIMEOUT_S=190 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_cta.py -k "ws2 and (numerics or graphs)"
TAILN=20 run bench 120 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_cta.py --sizes 512,1024,4096 --acts swiglu --k-chunks 4 --transports ce --micro-batches 2 --swiglu-shares rounds,work --out-dir $RES
