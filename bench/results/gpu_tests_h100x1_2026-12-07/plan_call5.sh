# One GPU, a fresh machine. On an H200: the kernel benchmark of record on today's kernels (every kernel with
# every variant, the cuBLAS paths and forms, each config call by call against cuBLAS) after the timing's own GPU
# test, then the GPU tests of every kernel variant. On another card (whose record is current): the ops at 2 and 4
# ranks sharing the GPU with ag_mm on its cuBLAS path (short chunks merged into a GEMM per contiguous range of
# slots, knobs.symm.AG_CUBLAS_MERGE_ROWS; numerics, then 100 calls bit-identical), the smoke set and the GPU tests of
# every kernel variant. run_stages runs in bench/. Afterwards: python bench/tools/install_ratios.py DIR, python
# bench/tools/variant_holdout.py DIR --ratios BEFORE and python bench/suites/kernel_paths.py DIR.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  TAILN=8 run timing_test 60 env PYTHONPATH=.. python -m pytest -q -rA -s -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_timing.py
  TAILN=12 run kernels 470 python suites/bench_kernels.py --out $RES/kernels --budget-s 400
  TAILN=6 run variants_test 80 env PYTHONPATH=.. python -m pytest -q -rA -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k "not measured_variant"
else
  TAILN=10 run agcublas 300 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -s -p no:cacheprovider ../tests/gpu/test_gpu.py -k "symm-agcublas and (ws2 or ws4) and (numerics or repeated)"
  TAILN=8 run smoke 150 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -n 3 -m gpu_smoke ../tests/gpu
  TAILN=6 run variants_test 80 env PYTHONPATH=.. python -m pytest -q -rA -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k "not measured_variant"
fi
