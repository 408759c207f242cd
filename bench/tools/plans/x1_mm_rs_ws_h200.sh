# One H200, after the kernel record: the GPU tests of every kernel variant (mm_rs's Gluon producer included), then
# mm_rs at every world size with its two Gluon forms (TMA or direct staging) as its only bench variants, against
# the op's candidates in the same run; installable with bench/tools/install_ratios.py.
TAILN=8 run variants_test 150 env PYTHONPATH=.. python -m pytest -q -rA -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k "not measured_variant"
TAILN=14 run rs_kernels 170 python suites/bench_kernels.py --out $RES/rs_ws --kernels mm_rs --budget-s 120 --set "codegen.VARIANTS_16BIT={'mm_rs': ((128,128,64,8,4,4,'ws_pingpong'),(128,128,64,8,4,4,'ws_pingpong_direct'))}"
