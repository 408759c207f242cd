# One GPU: mm_rs's Gluon producer in the cooperative form (codegen/mm_rs_ws.py, ws_coop): its GPU tests (mm_rs's
# stages, counts and reductions at 2 to 8 ranks, bias / epilogue / average, mm_ar's rounds), then, only if they
# passed, the kernel benchmark's mm_ar and mm_rs cases with it among the variants, each config's calls alternating
# with cuBLAS's, each result checked against float32.
TAILN=20 run rs_coop_test 150 python -m pytest -x -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_kernel_variants.py -k "ws_coop and (mm_rs_ws or mm_ar_ws)"
if grep -qE "^[0-9]+ passed" "$W/logs/rs_coop_test.log" 2>/dev/null; then
TAILN=14 run mm_ar 200 python bench/suites/bench_kernels.py --kernels mm_ar --budget-s 150 --out $RES/mm_ar
TAILN=30 run mm_rs 300 python bench/suites/bench_kernels.py --kernels mm_rs --budget-s 240 --out $RES/mm_rs
fi
