# One GPU: mm_rs's tile loop flattened with its K loop (store variants tma_subtile_flatten, tma_flatten). Its GPU
# tests first (partials arriving late, one to 48 K steps per tile), then mm_rs and mm_ar with every variant at
# every shape, then the ops running a measured variant (mm_rs's flattened one) with two ranks sharing the GPU
# (run_stages runs in bench/).
TAILN=25 run rs_flat_test 170 env PYTHONPATH=.. python -m pytest -q -rA -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k "mm_rs"
TAILN=45 run kernels 290 python suites/bench_kernels.py --out $RES/kernels --kernels mm_rs,mm_ar --budget-s 220
TAILN=8 run measured_variant 90 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k measured_variant
