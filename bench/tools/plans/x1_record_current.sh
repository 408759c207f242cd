# One GPU, a fresh machine. On an H200: the kernel benchmark of record on today's kernels (every kernel with
# every variant, the cuBLAS paths and forms, each config call by call against cuBLAS) after the timing's own GPU
# test, then the GPU tests of every kernel variant. On another card (whose record is current): the CTA op at 2 ranks
# sharing the GPU (few-row calls in 64-row blocks of 8 warps), the GPU tests of every kernel variant, the MoE op at 2
# and 4 ranks sharing the GPU (a fresh machine compiles its kernels: up to ~4 min) and the smoke set. run_stages
# runs in bench/. Afterwards: python bench/tools/install_ratios.py DIR, python bench/tools/variant_holdout.py DIR
# --ratios BEFORE and python bench/suites/kernel_paths.py DIR.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  TAILN=8 run timing_test 60 env PYTHONPATH=.. python -m pytest -q -rA -s -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_timing.py
  TAILN=12 run kernels 470 python suites/bench_kernels.py --out $RES/kernels --budget-s 400
  TAILN=6 run variants_test 80 env PYTHONPATH=.. python -m pytest -q -rA -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k "not measured_variant"
else
  TAILN=8 run cta_ws2 170 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -s -p no:cacheprovider ../tests/gpu/test_gpu_cta.py -k "symm_numerics and ws2"
  TAILN=6 run variants_test 80 env PYTHONPATH=.. python -m pytest -q -rA -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k "not measured_variant"
  TAILN=8 run moe_op 300 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -n 2 ../tests/gpu/test_gpu_moe.py -k "repeated and symm-default and (ws2 or ws4)"
  TAILN=8 run smoke 150 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -n 3 -m gpu_smoke ../tests/gpu
fi
