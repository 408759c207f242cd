# One GPU (Hopper), after x1_ag_mm_ws.sh: what that call left of ag_mm's warp-specialized Gluon kernel. Its generated
# epilogues against float32 with late shards; the op at 2 ranks sharing the GPU, tuning over a measured Gluon variant
# (no other candidate) and computing the right result; then ag_mm at every world size's shapes with the op's
# candidates and the two Gluon forms as its only variants, fused-GELU rows included (installable with
# bench/tools/install_ratios.py, as ag_ws4/ and ag_ws8/ of bench/results/kernels_h200x1_2026-12-07 were).
TAILN=10 run ws_tests 220 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -s -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k "measured_variant or generated_epilogue"
TAILN=14 run ag_kernels 300 python suites/bench_kernels.py --out $RES/ag_ws --kernels ag_mm --budget-s 240 --set "codegen.VARIANTS_16BIT={'ag_mm': ((128,128,64,8,4,4,'ws_pingpong'),(128,256,64,8,3,4,'ws_coop'))}"
