# The next GPU call (nvidia-h200-x2), for what this session changed after its device time ran out:
#  - cta_symm.EAGER_GRAPHS (off): eager calls replay the op's own captured graph (numerics, back-to-back
#    calls, weight update; then the eager op time with it, probe variant eagergraphs);
#  - captured calls pin the data buffer, peer tables and staging buffers (the graphs test).
# Turn EAGER_GRAPHS on only if the test passes and the eager op is faster at M = 512 / 1024.
#   mkdir devrun; cp bench/results/2026-11-30_h200x2_session6/commands/dev_run.sh bench/results/2026-11-30_h200x2_session13/commands/next.sh devrun/
#   DEADLINE=560 bash devrun/dev_run.sh devrun/next.sh
TAILN=10 run t_cta 300 env OVERLAP_TEST_TIMEOUT_S=290 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_cta.py -k "ws2 and (numerics or graphs)"
TAILN=4 run probe 60 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_cta.py --sizes 512,1024 --op-variants eagergraphs
TAILN=12 run bench 150 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_cta.py --sizes 512,1024,4096 --acts gelu,swiglu --k-chunks 4 --transports ce --micro-batches 2,4 --graphs --out-dir $RES
