# Thirteenth session, run 5: the bench with graphs again (is run 4's graph column repeatable?), and GELU M=512
# tails around the default with the split last round.
TAILN=12 run bench 170 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_cta.py --sizes 512,1024,4096 --acts gelu,swiglu --k-chunks 4 --transports ce --micro-batches 2,4 --graphs --out-dir $RES
TAILN=4 run probe 90 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_cta.py --sizes 512,1024 --gpu-bound --op-variants tail5120,tail7168,nosplit
