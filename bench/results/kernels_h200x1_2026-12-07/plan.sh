# One GPU (Hopper): ag_mm's warp-specialized Gluon kernel (store variants ws_pingpong, ws_coop: codegen/ag_mm_ws.py). Its GPU
# tests first (flags set and late shards, both tile orders, N a multiple of the tile or not, a wait that gives up),
# then the kernel benchmark of ag_mm at 8 GPUs' shapes: the op's tuning candidates and the two Gluon forms as its only variants (a record
# of ag_mm that bench/tools/install_ratios.py can install: the op's ratio, and the Gluon form where it won); then,
# with what time is left, the plain Gluon GEMM probe at two shapes (M x N x K). Caps for DEADLINE=250.
TAILN=14 run ws_tests 100 env PYTHONPATH=.. python -m pytest -q -rA -s -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k "ws_pingpong or ws_coop or gives_up"
TAILN=40 run ag_kernels 145 python suites/bench_kernels.py --out $RES/ag_ws --kernels ag_mm --ws 8 --budget-s 95 --set "codegen.VARIANTS_16BIT={'ag_mm': ((128,128,64,8,4,4,'ws_pingpong'),(128,256,64,8,3,4,'ws_coop'))}"
TAILN=14 run gluon_probe 100 python probes/gluon_ws/gpu_check.py --shapes 8192x7168x8192,8192x768x4096 --configs coop,pingpong --out $RES/gluon_probe.json
