# One GPU, a fresh machine: the kernel benchmark of record, every kernel with every variant, the cuBLAS paths and
# forms (GPU times of queued calls, each config call by call against cuBLAS), after the timing's own GPU test,
# then the GPU tests of the kernel variants and tile orders (run_stages runs in bench/). Afterwards:
# python bench/tools/install_ratios.py DIR, then python bench/tools/variant_holdout.py DIR --ratios BEFORE (the
# variants the installed file had adopted, timed again) and python bench/suites/kernel_paths.py DIR.
TAILN=8 run timing_test 60 env PYTHONPATH=.. python -m pytest -q -rA -s -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_timing.py
TAILN=12 run kernels 470 python suites/bench_kernels.py --out $RES/kernels --budget-s 400
TAILN=6 run variants_test 80 env PYTHONPATH=.. python -m pytest -q -rA -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k "not measured_variant"
