# One GPU, ranks sharing it: ag_mm, mm_rs and mm_ar run the variant their ratio entry names (run_stages runs in bench/).
TAILN=12 run measured_variant 200 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k measured_variant
