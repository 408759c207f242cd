# One H200, ranks sharing it, a fresh machine: the smoke set cold, the host-time benchmark with private
# graphs at 32 layers per key, then the smoke set warm in a loop until the deadline (run_stages runs in bench/).
SMOKE="env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu_smoke -n 3 ../tests/gpu"
TAILN=12 run smoke_cold 300 $SMOKE
TAILN=60 run bench_host 200 env OVERLAP_TIMEOUT_S=60 python -m torch.distributed.run --standalone --nproc-per-node=2 suites/bench_host.py --out $RES/host --sizes 512,8192 --profile --private-graphs --layers 32
for i in $(seq 1 8); do TAILN=2 run smoke_warm$i 110 $SMOKE; done
