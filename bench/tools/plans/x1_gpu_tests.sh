# One GPU, ranks sharing it where a test has ranks, most wanted first (a short lease runs the head): the ops tuning over
# and running a measured variant (the Gluon kernels included, ag_mm's with a fused epilogue), both Gluon kernels with
# their epilogues in pieces of 8, 16 and 32 values a thread, mm_ar on its TMA variant (knobs.symm.AR_TMA, off by
# default) at 2 and 4 ranks, the smoke set, the GPU tests of every kernel variant, and the ops at 2 and 4 ranks with
# ag_mm on its cuBLAS path (numerics, then 100 calls bit-identical). The kernel record is x1_full_record.sh.
TAILN=8 run measured_variant 120 env OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -s -p no:cacheprovider -m gpu tests/gpu/test_gpu_kernel_variants.py -k measured_variant
TAILN=8 run ws_tests 150 python -m pytest -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_kernel_variants.py -k "ws_generated_epilogue or mm_rs_ws"
TAILN=8 run artma 200 env OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -s -p no:cacheprovider tests/gpu/test_gpu.py -k "symm-artma and (ws2 or ws4) and (numerics or repeated)"
TAILN=8 run smoke 100 env OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -n 3 -m gpu_smoke tests/gpu
TAILN=6 run variants_test 150 python -m pytest -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_kernel_variants.py -k "not measured_variant"
TAILN=10 run agcublas 300 env OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -s -p no:cacheprovider tests/gpu/test_gpu.py -k "symm-agcublas and (ws2 or ws4) and (numerics or repeated)"
