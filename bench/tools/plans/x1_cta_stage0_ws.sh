# One GPU: CTA stage 0's warp-specialized Gluon forms (codegen/cta_ws.py): their kernel test (staged blocks by TMA,
# the tail kept, every shipped chunk counted, a W1 window, two calls on new tensors), then the kernel benchmark's
# cta_stage0 cases, the forms as bench variants where stage 0 does not split K (prefill sizes; only if their test
# passed: a form that hangs would hold the benchmark to its cap), each config's calls alternating with cuBLAS +
# F.gelu's, each result checked against float32; then the CTA op at 2 ranks sharing the GPU, which runs its 16-bit
# GELU cases in each form too (knobs.cta.STAGE0_FORM), given time to compile.
TAILN=30 run cta0_ws_test 170 python -m pytest -x -s -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_kernel_variants.py -k cta_stage0_ws
if grep -qE "^[0-9]+ passed" "$W/logs/cta0_ws_test.log" 2>/dev/null; then CTA_VARIANTS=""; else CTA_VARIANTS="--no-variants"; fi
TAILN=24 run cta0 180 python bench/suites/bench_kernels.py --kernels cta_stage0 --budget-s 130 --out $RES/cta0 $CTA_VARIANTS
TAILN=8 run cta_ws2 200 env OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=15 python -m pytest -x -s -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_cta.py -k "symm_numerics and ws2"
