# One GPU: CTA stage 0 with its fused tanh GELU at every world size's decode shapes (16 and 128 rows: the shapes whose
# stage 0 splits K), the split tiles summed by each tile's last run (the knob as set) and by the fix-up kernel after the
# runs (knobs.cta.STAGE0_SPLIT_FIXUP), each result checked against float32 by the benchmark.
SWEEP="python bench/suites/bench_kernels.py --kernels cta_stage0 --max-rows 128 --no-variants --budget-s 40"
TAILN=8 run cta0_in_kernel 55 $SWEEP --out $RES/cta0_in_kernel
TAILN=8 run cta0_fixup 55 $SWEEP --out $RES/cta0_fixup --set cta.STAGE0_SPLIT_FIXUP=True
