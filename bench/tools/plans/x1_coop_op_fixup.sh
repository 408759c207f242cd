# One GPU: the ops on today's ratios and knobs, each result checked against float32. mm_rs's cooperative Gluon form in
# the op at 2 ranks sharing the GPU (the ops tune over the measured variant and must take it); the CTA op at 2 ranks
# (stage 0's split sums by the fix-up kernel at 65-128-row calls, each split-sum form flipped on splitting cases, stage
# 0's Gluon forms); the MoE op at 2 ranks on the installed ratios (its down GEMM's measured Gluon forms).
TAILN=10 run coop_op 110 env OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=15 python -m pytest -x -s -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_kernel_variants.py -k "test_ops_run_the_measured_variant and gluon_coop_both"
TAILN=8 run cta_ws2 150 env OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=15 python -m pytest -x -s -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_cta.py -k "symm_numerics and ws2"
TAILN=8 run moe_ws2 150 env OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=20 python -m pytest -x -s -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_moe.py -k "ws2-symm-default"
