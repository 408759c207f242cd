# One H200, ranks sharing it: the CTA stages on cuBLAS (ws 2) and mm_ar's one-shot sum by torch (ws 2), run
# side by side to fit a short call (run_stages runs in bench/).
T="env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider"
par() { (TAILN=30 run oneshot 240 $T ../tests/gpu/test_gpu_oneshot.py -k ws2 -n 2) & TAILN=40 run cta_cublas 240 $T ../tests/gpu/test_gpu_cta_cublas.py -k ws2; wait; }
par
