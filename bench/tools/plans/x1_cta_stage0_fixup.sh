# One GPU: CTA stage 0 with its fused tanh GELU at every world size's decode shapes (16 and 128 rows: the shapes whose
# stage 0 splits K), the split tiles summed by each tile's last run (the knob as set) and by the fix-up kernel after the
# runs (knobs.cta.STAGE0_SPLIT_FIXUP), each result checked against float32 by the benchmark. Then the CTA op at 2 ranks
# sharing the GPU (its 96-row case takes stage 1's fix-up by default; each split-K sum form flipped on three splitting
# cases, stage 0's fix-up included), and the MoE op's comm-kernel variant at 2 ranks, each given time to compile first.
SWEEP="python bench/suites/bench_kernels.py --kernels cta_stage0 --max-rows 128 --no-variants --budget-s 40"
TAILN=8 run cta0_in_kernel 55 $SWEEP --out $RES/cta0_in_kernel
TAILN=8 run cta0_fixup 55 $SWEEP --out $RES/cta0_fixup --set cta.STAGE0_SPLIT_FIXUP=True
TAILN=8 run cta_ws2 200 env OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=15 python -m pytest -x -s -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_cta.py -k "symm_numerics and ws2"
TAILN=8 run moe_sm8 230 env OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=20 python -m pytest -x -s -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_moe.py -k ws2-symm-sm8
