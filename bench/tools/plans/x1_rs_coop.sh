# One GPU: mm_rs's Gluon producer in the cooperative form (codegen/mm_rs_ws.py, ws_coop): its GPU tests (mm_rs's
# stages, counts and reductions at 2 to 8 ranks, bias / epilogue / average, mm_ar's rounds), then, only if they
# passed, the kernel benchmark's mm_ar and mm_rs cases with the Gluon forms as the only variants (the cooperative one
# is not in knobs.codegen.VARIANTS_16BIT until this test passed), each config's calls alternating with cuBLAS's,
# each result checked against float32.
TAILN=20 run rs_coop_test 150 python -m pytest -x -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_kernel_variants.py -k "ws_coop and (mm_rs_ws or mm_ar_ws)"
if grep -qE "^[0-9]+ passed" "$W/logs/rs_coop_test.log" 2>/dev/null; then
RS_FORMS="codegen.VARIANTS_16BIT={'mm_rs': ((128,128,64,8,4,4,'ws_pingpong'),(128,256,64,8,3,4,'ws_coop'))}"
TAILN=14 run mm_ar 200 python bench/suites/bench_kernels.py --kernels mm_ar --budget-s 150 --out $RES/mm_ar --set "$RS_FORMS"
TAILN=30 run mm_rs 300 python bench/suites/bench_kernels.py --kernels mm_rs --budget-s 240 --out $RES/mm_rs --set "$RS_FORMS"
fi
