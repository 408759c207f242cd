# One GPU, warm: the MoE op with its comm kernel on 8 SMs at 2 ranks sharing the GPU (x1_cta_split_sum.sh's first
# stage, given time to compile), then CTA stage 1 at every world size's decode shapes (16 and 128 rows) with the split
# tiles summed in the kernel one slot at a time (the knob as set), two at a time, and by the fix-up kernel.
TAILN=8 run moe_sm8 150 env OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=20 python -m pytest -x -s -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_moe.py -k ws2-symm-sm8
SWEEP="python bench/suites/bench_kernels.py --kernels cta_stage1 --max-rows 128 --no-variants --budget-s 40"
TAILN=8 run cta1_slots 55 $SWEEP --out $RES/cta1_slots
TAILN=8 run cta1_pairs 55 $SWEEP --out $RES/cta1_pairs --set cta.SPLIT_SUM_PAIRS=True
TAILN=8 run cta1_fixup 55 $SWEEP --out $RES/cta1_fixup --set cta.STAGE1_SPLIT_FIXUP=True
