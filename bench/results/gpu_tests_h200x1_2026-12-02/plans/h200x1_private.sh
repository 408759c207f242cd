# One H200, ranks sharing it, a fresh machine: the smoke set cold (Triton compiling; private graphs on by
# default), the host-time benchmark with the ops' private CUDA graphs beside their eager host path, then the
# smoke set warm (run_stages runs in bench/).
TAILN=30 run smoke 300 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu_smoke -n 3 ../tests/gpu
TAILN=60 run bench_host 300 env OVERLAP_TIMEOUT_S=60 python -m torch.distributed.run --standalone --nproc-per-node=2 suites/bench_host.py --out $RES/host --sizes 128,512,2048,8192 --profile --private-graphs
TAILN=8 run smoke_warm 150 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu_smoke -n 3 ../tests/gpu
