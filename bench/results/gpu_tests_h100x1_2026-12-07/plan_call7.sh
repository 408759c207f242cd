# One GPU, ranks sharing it: the ops at 2 ranks tuning over a measured variant, ag_mm's and mm_rs's Gluon kernels
# included (the op runs the variant the ratio file names and computes the right result), then the smoke set on
# the installed ratios.
TAILN=8 run measured_variant 170 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -s -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k measured_variant
TAILN=6 run smoke 90 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -n 3 -m gpu_smoke ../tests/gpu
