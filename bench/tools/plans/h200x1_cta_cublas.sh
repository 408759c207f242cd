# One H200, ranks sharing it: the CTA stages on cuBLAS at ws 2 (run_stages runs in bench/).
TAILN=30 run cta_cublas 85 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider ../tests/gpu/test_gpu_cta_cublas.py -k ws2
