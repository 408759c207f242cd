# One GPU: ag_mm's store variants with late-arriving shards (the flattened and warp-specialized loops must wait
# before they load), then the collective GEMMs' kernels with every variant at every shape, a second run beside
# the one whose best variants are installed (run_stages runs in bench/).
TAILN=20 run variants_test 240 env PYTHONPATH=.. python -m pytest -q -rA -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py
TAILN=70 run collective 330 python suites/bench_kernels.py --out $RES/kernels --kernels ag_mm,mm_rs,mm_ar --budget-s 250
