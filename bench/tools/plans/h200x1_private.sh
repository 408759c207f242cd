# One H200, ranks sharing it, a fresh machine: the smoke set cold (Triton compiling), then the host-time
# benchmark with the ops' private CUDA graphs beside the eager ops (run_stages runs in bench/).
TAILN=30 run smoke 300 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu_smoke -n 3 ../tests/gpu
TAILN=40 run bench_host 240 env OVERLAP_TIMEOUT_S=60 python -m torch.distributed.run --standalone --nproc-per-node=2 suites/bench_host.py --out $RES/host --sizes 512,8192 --profile --private-graphs
