# One GPU (Hopper): ag_mm's Gluon kernel with its generated epilogue on column slices of the tile in shared memory
# (knobs.codegen.GLUON_EPILOGUE_VALUES) and on the registers, against float32 with late shards; then ag_mm at every
# world size with the two Gluon forms as its only variants (the fused-GELU rows are the change; installable with
# bench/tools/install_ratios.py).
TAILN=12 run ws_tests 150 env PYTHONPATH=.. python -m pytest -q -rA -s -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k "generated_epilogue"
TAILN=14 run ag_kernels 300 python suites/bench_kernels.py --out $RES/ag_ws --kernels ag_mm --budget-s 240 --set "codegen.VARIANTS_16BIT={'ag_mm': ((128,128,64,8,4,4,'ws_pingpong'),(128,256,64,8,3,4,'ws_coop'))}"
