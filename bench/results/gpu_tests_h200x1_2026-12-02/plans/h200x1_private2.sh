# One H200, ranks sharing it, a fresh machine: the smoke set cold (private graphs on by default), the
# host-time benchmark's second run, then the smoke set warm twice (run_stages runs in bench/).
TAILN=30 run smoke 300 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu_smoke -n 3 ../tests/gpu
TAILN=40 run bench_host 200 env OVERLAP_TIMEOUT_S=60 python -m torch.distributed.run --standalone --nproc-per-node=2 suites/bench_host.py --out $RES/host --sizes 512,8192 --profile --private-graphs
TAILN=8 run smoke_warm1 120 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu_smoke -n 3 ../tests/gpu
TAILN=8 run smoke_warm2 120 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu_smoke -n 3 ../tests/gpu
