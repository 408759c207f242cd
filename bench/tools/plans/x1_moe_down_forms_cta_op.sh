# One GPU, one call: the kernel benchmark's moe_down cases with the MoE down GEMM's Gluon forms among the variants
# (codegen/moe_down_ws.py; their GPU test passed on an H100), each config's calls alternating with torch._grouped_mm's,
# each result checked against float32; then the CTA op at 2 ranks sharing the GPU, which runs its 16-bit GELU cases
# in each stage-0 Gluon form too (knobs.cta.STAGE0_FORM) and its default cases on the installed ratios' choice.
TAILN=30 run moe_down 240 python bench/suites/bench_kernels.py --kernels moe_down --budget-s 170 --out $RES/moe_down
TAILN=8 run cta_ws2 290 env OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=15 python -m pytest -x -s -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_cta.py -k "symm_numerics and ws2"
