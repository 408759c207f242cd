# One GPU: mm_ar's rounds on mm_rs's warp-specialized Gluon producer (codegen/mm_rs_ws.py, WRITE_GATHER): its GPU test
# (rounds, the reduced tiles into out and the gather region, every band counted, partials landing late), then the
# kernel benchmark's mm_ar cases with the Gluon form among the bench variants (only if its test passed), each config's
# calls alternating with cuBLAS's, each result checked against float32.
TAILN=20 run mm_ar_ws_test 200 python -m pytest -x -s -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_kernel_variants.py -k "mm_ar_ws or mm_rs_ws_stages"
if grep -qE "^[0-9]+ passed" "$W/logs/mm_ar_ws_test.log" 2>/dev/null; then AR_VARIANTS=""; else AR_VARIANTS="--no-variants"; fi
TAILN=24 run mm_ar 300 python bench/suites/bench_kernels.py --kernels mm_ar --budget-s 230 --out $RES/mm_ar $AR_VARIANTS
