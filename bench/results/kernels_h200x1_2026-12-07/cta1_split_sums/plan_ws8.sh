# One GPU: CTA stage 1 at 8 GPUs' decode shapes (16 and 128 rows, the op's config only), the finishing run of each
# split tile reading the other runs' slots one at a time (the knob as set), two at a time (knobs.cta.SPLIT_SUM_PAIRS),
# summed by a kernel after the runs, a few rows a program on every SM (knobs.cta.STAGE1_SPLIT_FIXUP), and in 64-column
# tiles (twice the tiles, half the runs: a quarter of the bytes the finishing run reads); each result checked against
# float32 by the benchmark. First the MoE op with its comm kernel on 8 SMs at 2 ranks sharing the GPU,
# each rank's kernels now bound by half the SMs less the free ones (support.kernel_sms; it hung before).
TAILN=6 run moe_sm8 70 env OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=20 python -m pytest -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_moe.py -k ws2-symm-sm8
SWEEP="python bench/suites/bench_kernels.py --kernels cta_stage1 --ws 8 --max-rows 128 --no-variants --budget-s 30"
TAILN=6 run cta1_slots 40 $SWEEP --out $RES/cta1_ws8_slots
TAILN=6 run cta1_pairs 40 $SWEEP --out $RES/cta1_ws8_pairs --set cta.SPLIT_SUM_PAIRS=True
TAILN=6 run cta1_fixup 40 $SWEEP --out $RES/cta1_ws8_fixup --set cta.STAGE1_SPLIT_FIXUP=True
TAILN=6 run cta1_bn64 40 $SWEEP --out $RES/cta1_ws8_bn64 --set "cta.STAGE1_CONFIG_DECODE=(128,64,64,0,4,8)"
# Then the CTA op at 2 ranks sharing the GPU, the split sums in each form on its splitting cases (the test flips both knobs).
TAILN=8 run cta_ws2 150 env OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_cta.py -k "symm_numerics and ws2"
# Last, CTA stage 0's warp states where it is furthest from cuBLAS + GELU (x1_cta_stage0_profile.sh's first stage).
NCU="ncu --clock-control none --nvtx --nvtx-include run_case/ --launch-skip 1 --launch-count 1 -k regex:stage0_kernel --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --section SourceCounters --import-source yes --csv --page details"
TAILN=4 run s0_ws8_128 90 $NCU --log-file $RES/cta0_ws8_128.csv python bench/probes/run_case.py cta_stage0 8 128x8192x7168 --epilogue gelu_tanh
