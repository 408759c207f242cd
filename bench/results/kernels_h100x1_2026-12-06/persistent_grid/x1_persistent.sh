# One GPU: the collective GEMMs' kernels with up to two CTAs per SM (knobs.codegen.PERSISTENT_CTAS_PER_SM=2) and
# with one (the default then), every variant (the few-stage tiles that fit two on an SM among them), in one call;
# first the GPU tests of the two-per-SM grids (run_stages runs in bench/).
TAILN=8 run tests 120 env PYTHONPATH=.. python -m pytest -q -rA -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k "two_ctas or occupancy" -s
TAILN=4 run per_sm2 215 python suites/bench_kernels.py --out $RES/per_sm2 --kernels ag_mm,mm_rs,mm_ar --budget-s 160 --set codegen.PERSISTENT_CTAS_PER_SM=2
TAILN=4 run per_sm1 215 python suites/bench_kernels.py --out $RES/per_sm1 --kernels ag_mm,mm_rs,mm_ar --budget-s 160 --set codegen.PERSISTENT_CTAS_PER_SM=1
