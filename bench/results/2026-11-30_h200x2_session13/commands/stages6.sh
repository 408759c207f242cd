# Thirteenth session, run 6: stage 1 ships the last group's rows before adding the tails (SHIP_BEFORE_TAILS, on,
# untested on GPUs before this): GPU numerics (ranks bit-identical) and graphs; GPU-bound times and a trace; the bench.
TAILN=10 run t_cta 250 env OVERLAP_TEST_TIMEOUT_S=240 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_cta.py -k "ws2 and (numerics or graphs)"
TAILN=6 run probe 80 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_cta.py --sizes 512,1024,4096 --gpu-bound --op-variants noshipfirst --gpu-bound-trace $TRACES
TAILN=12 run bench 110 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_cta.py --sizes 512,1024,4096 --acts gelu,swiglu --k-chunks 4 --transports ce --micro-batches 2 --graphs --out-dir $RES
