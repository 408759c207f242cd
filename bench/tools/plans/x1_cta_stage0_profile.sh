# One GPU (ncu reads the counters; clocks left alone): CTA stage 0 with its fused tanh GELU, where it is furthest from
# cuBLAS + the separate GELU (8 GPUs' 128 x 8192 x 7168: 1.21x; 4 GPUs' 1024 x 8192 x 14336: 1.09x on the H100
# record). Its persistent kernel compiles to 4.2k SASS instructions at 255 registers (erf GELU: 5.8k, 112 B spilled;
# SwiGLU 2.6k; bench/probes/probe_compile.py cta_stage0 --set ACT=1): whether its warps stall on instruction fetch, as
# ag_mm's Gluon kernel did at 11k, or on memory. One steady-state launch each, its warp states and source lines.
NCU="ncu --clock-control none --nvtx --nvtx-include run_case/ --launch-skip 1 --launch-count 1 -k regex:stage0_kernel --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --section SourceCounters --import-source yes --csv --page details"
TAILN=4 run s0_ws8_128 90 $NCU --log-file $RES/cta0_ws8_128.csv python bench/probes/run_case.py cta_stage0 8 128x8192x7168 --epilogue gelu_tanh
TAILN=4 run s0_ws4_1024 90 $NCU --log-file $RES/cta0_ws4_1024.csv python bench/probes/run_case.py cta_stage0 4 1024x8192x14336 --epilogue gelu_tanh
