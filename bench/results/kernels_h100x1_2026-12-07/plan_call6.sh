# One GPU, a short call: mm_ar's rounds kernel with its TMA variant (knobs.symm.AR_TMA) in the op at 2 ranks sharing
# the GPU (numerics; lowering symm-artma), then the kernel benchmark's mm_ar cases with it among the candidates.
TAILN=8 run artma_test 75 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -s -p no:cacheprovider ../tests/gpu/test_gpu.py -k "ws2 and symm-artma and numerics"
TAILN=14 run ar_kernels 60 python suites/bench_kernels.py --out $RES/ar_tma --kernels mm_ar --budget-s 30 --set "symm.AR_TMA='on'"
