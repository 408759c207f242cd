# One H200, ranks sharing it: the GPU smoke set and the fused gate/up MoE test (run_stages runs in bench/).
TAILN=40 run smoke 330 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu_smoke -n 3 ../tests/gpu
TAILN=20 run fused_moe 200 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -n 4 ../tests/gpu/test_gpu_moe.py -k "fused and ws2"
