# One GPU, ranks sharing it: the GPU smoke set (every symm op once at 2 ranks, eager and captured, timeouts,
# dead peers) on the current code (run_stages runs in bench/).
TAILN=12 run smoke 240 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu_smoke -n 3 ../tests/gpu
