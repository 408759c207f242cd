# One GPU, one call: the GPU tests of CTA stage 0's Gluon forms (codegen/cta_ws.py) and of mm_ar's rounds on mm_rs's
# Gluon producer (codegen/mm_rs_ws.py, WRITE_GATHER), then the kernel benchmark's cta_stage0 and mm_ar cases with
# those forms among the bench variants (each only if its test passed: a form that hangs would hold the benchmark to
# its cap), each config's calls alternating with cuBLAS's (+ F.gelu's), each result checked against float32.
TAILN=20 run cta0_ws_test 150 python -m pytest -x -s -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_kernel_variants.py -k cta_stage0_ws
TAILN=20 run mm_ar_ws_test 150 python -m pytest -x -s -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_kernel_variants.py -k mm_ar_ws
if grep -qE "^[0-9]+ passed" "$W/logs/cta0_ws_test.log" 2>/dev/null; then CTA_VARIANTS=""; else CTA_VARIANTS="--no-variants"; fi
if grep -qE "^[0-9]+ passed" "$W/logs/mm_ar_ws_test.log" 2>/dev/null; then AR_VARIANTS=""; else AR_VARIANTS="--no-variants"; fi
TAILN=24 run cta0 150 python bench/suites/bench_kernels.py --kernels cta_stage0 --budget-s 110 --out $RES/cta0 $CTA_VARIANTS
TAILN=24 run mm_ar 150 python bench/suites/bench_kernels.py --kernels mm_ar --budget-s 110 --out $RES/mm_ar $AR_VARIANTS
