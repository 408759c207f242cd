# One GPU: the GPU tests of every kernel variant again, with a cap that lets them finish.
TAILN=10 run variants_test 220 env PYTHONPATH=.. python -m pytest -q -rA -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k "not measured_variant"
