# One GPU (run_stages runs in bench/): the GPU tests of the open A/Bs (x1_open_ab2.sh): mm_rs's own tiles prefetching
# the peers' partials (flags set and partials late), the kernel variants, the CTA op at 2 ranks sharing the GPU
# (few-row calls in 64-row blocks of 8 warps, as set), then the smoke set.
TAILN=8 run prefetch_test 90 env PYTHONPATH=.. python -m pytest -q -rA -s -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k "prefetch"
TAILN=6 run variants_test 80 env PYTHONPATH=.. python -m pytest -q -rA -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k "not measured_variant and not prefetch"
TAILN=8 run cta_ws2 200 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -s -p no:cacheprovider ../tests/gpu/test_gpu_cta.py -k "symm_numerics and ws2"
TAILN=8 run smoke 150 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -n 3 -m gpu_smoke ../tests/gpu
