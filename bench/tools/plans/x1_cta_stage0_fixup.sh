# One GPU: CTA stage 0 with its fused tanh GELU at every world size's decode shapes (16 and 128 rows: the shapes whose
# stage 0 splits K), the split tiles summed by each tile's last run (the knob as set) and by the fix-up kernel after the
# runs (knobs.cta.STAGE0_SPLIT_FIXUP), 4 and 8 rows a program; stage 1's fix-up (128 rows) with 8 and 16 rows a program
# (fewer pieces: fewer counts on each row block's counter); each result checked against float32 by the benchmark.
# Then the CTA op at 2 ranks sharing the GPU (its 96-row case takes stage 1's fix-up by default; each split-K sum form
# flipped on three splitting cases, stage 0's fix-up included), given time to compile first.
SWEEP0="python bench/suites/bench_kernels.py --kernels cta_stage0 --max-rows 128 --no-variants --budget-s 40"
SWEEP1="python bench/suites/bench_kernels.py --kernels cta_stage1 --max-rows 128 --no-variants --budget-s 40"
TAILN=8 run cta0_in_kernel 55 $SWEEP0 --out $RES/cta0_in_kernel
TAILN=8 run cta0_fixup 55 $SWEEP0 --out $RES/cta0_fixup --set cta.STAGE0_SPLIT_FIXUP=True
TAILN=8 run cta0_fixup_rows8 55 $SWEEP0 --out $RES/cta0_fixup_rows8 --set cta.STAGE0_SPLIT_FIXUP=True --set cta.STAGE0_FIXUP_ROWS=8
TAILN=8 run cta1_rows8 55 $SWEEP1 --out $RES/cta1_rows8 --set cta.STAGE1_FIXUP_ROWS=8
TAILN=8 run cta1_rows16 55 $SWEEP1 --out $RES/cta1_rows16 --set cta.STAGE1_FIXUP_ROWS=16
TAILN=8 run cta_ws2 200 env OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=15 python -m pytest -x -s -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_cta.py -k "symm_numerics and ws2"
