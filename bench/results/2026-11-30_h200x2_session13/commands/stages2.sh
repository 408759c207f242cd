# Thirteenth session, run 2: the new defaults (STAGE0_TMA_STORE, SWIGLU_SHARE_ROUNDS on) verified and timed;
# GPU-bound traces of the op at M=512/1024/4096 for the critical path.
TAILN=8 run t_cta 200 env OVERLAP_TEST_TIMEOUT_S=190 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_cta.py -k "ws2 and (numerics or graphs)"
TAILN=12 run probe 150 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_cta.py --sizes 512,1024,4096 --gpu-bound --op-variants notma,tail4096,tail10240 --gpu-bound-trace $TRACES
TAILN=24 run bench 200 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_cta.py --sizes 512,1024,4096 --acts gelu,swiglu --k-chunks 4 --transports ce --micro-batches 2,4 --graphs --out-dir $RES
