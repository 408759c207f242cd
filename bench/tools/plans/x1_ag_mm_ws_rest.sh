# One GPU (Hopper), after x1_ag_mm_ws.sh: what that call left of ag_mm's warp-specialized Gluon kernel. The op at
# 2 ranks sharing the GPU, tuning over a measured Gluon variant (no other candidate) and computing the right result;
# then ag_mm at 2 GPUs' shapes with the op's candidates and the two Gluon forms as its only variants (installable
# with bench/tools/install_ratios.py, as ag_ws4/ and ag_ws8/ of bench/results/kernels_h200x1_2026-12-07 were).
TAILN=10 run measured_ws 200 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -s -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k "measured_variant"
TAILN=14 run ag_kernels_ws2 200 python suites/bench_kernels.py --out $RES/ag_ws2 --kernels ag_mm --ws 2 --budget-s 140 --set "codegen.VARIANTS_16BIT={'ag_mm': ((128,128,64,8,4,4,'ws_pingpong'),(128,256,64,8,3,4,'ws_coop'))}"
