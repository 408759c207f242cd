# One GPU (Hopper): mm_rs's warp-specialized Gluon producer (codegen/mm_rs_ws.py) and ag_mm's Gluon kernel with its
# generated epilogue on column slices of the tile in shared memory. The GPU tests of both (staging, band counts,
# the own chunk's sum with late partials, bias / epilogue / average, a wait that gives up; the epilogue in
# registers and in slices); then mm_rs at every world size with its two Gluon forms (TMA or direct staging) as its only variants, and ag_mm with
# its two Gluon forms as the only variants (the fused-GELU rows are the change); installable with
# bench/tools/install_ratios.py.
TAILN=14 run ws_tests 170 env PYTHONPATH=.. python -m pytest -q -rA -s -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k "mm_rs_ws or (generated_epilogue and in_shared_slices)"
TAILN=14 run rs_kernels 170 python suites/bench_kernels.py --out $RES/rs_ws --kernels mm_rs --budget-s 120 --set "codegen.VARIANTS_16BIT={'mm_rs': ((128,128,64,8,4,4,'ws_pingpong'),(128,128,64,8,4,4,'ws_pingpong_direct'))}"
TAILN=14 run ag_kernels 170 python suites/bench_kernels.py --out $RES/ag_ws --kernels ag_mm --budget-s 120 --set "codegen.VARIANTS_16BIT={'ag_mm': ((128,128,64,8,4,4,'ws_pingpong'),(128,256,64,8,3,4,'ws_coop'))}"
