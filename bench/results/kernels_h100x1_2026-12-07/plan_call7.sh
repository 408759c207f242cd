# One GPU (Firecracker: ncu reads the counters there; clocks left alone): Nsight Compute sections of the kernels still
# over 1.03x cuBLAS, one steady-state launch each (bench/probes/run_case.py: the benchmark's case, checked, then a few
# calls in an NVTX range; the second call's launch of the named kernel profiled), beside the cuBLAS kernel of the same
# GEMM where it says so: ag_mm's Gluon ping-pong kernel with and without its fused bias + GELU and the tl kernel
# fused (why the Gluon epilogue does not hide under the other warpgroup's main loop), mm_rs at 8 GPUs' short K
# (memory-bound?), CTA stage 1 at 8 GPUs' decode size and the MoE down GEMM at DeepSeek-like prefill.
NCU="ncu --clock-control none --nvtx --nvtx-include run_case/ --launch-skip 1 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --csv --page details"
PP="(128,128,64,8,4,4,'ws_pingpong')"
TAILN=4 run ws_gelu 90 $NCU -k regex:ag_mm_ws_kernel --log-file $RES/ag_ws_pingpong_gelu.csv python bench/probes/run_case.py ag_mm 4 8192x4096x3584 --epilogue gelu --config "$PP"
TAILN=4 run ws_plain 90 $NCU -k regex:ag_mm_ws_kernel --log-file $RES/ag_ws_pingpong_plain.csv python bench/probes/run_case.py ag_mm 4 8192x4096x3584 --config "$PP"
TAILN=4 run tl_gelu 90 $NCU -k regex:ag_mm_kernel --log-file $RES/ag_tl_gelu.csv python bench/probes/run_case.py ag_mm 4 8192x4096x3584 --epilogue gelu --config "(128,256,64,8,3,8,True)"
TAILN=4 run rs_short_k 90 $NCU -k regex:mm_rs_kernel --log-file $RES/rs_ws8_short_k.csv python bench/probes/run_case.py mm_rs 8 16384x256x8192 --config "(128,256,64,8,3,8,True)"
TAILN=4 run rs_short_k_cublas 90 $NCU -k regex:"nvjet|xmma|cutlass|gemm" --log-file $RES/rs_ws8_short_k_cublas.csv python bench/probes/run_case.py mm_rs 8 16384x256x8192 --config "(128,256,64,8,3,8,True)" --calls 3 --baseline
TAILN=4 run cta1_decode 90 $NCU -k regex:stage1_kernel --log-file $RES/cta1_ws8_128.csv python bench/probes/run_case.py cta_stage1 8 128x28672x2048
TAILN=4 run moe_down 90 $NCU -k regex:down_kernel --log-file $RES/moe_down_deepseek_ws8.csv python bench/probes/run_case.py moe_down 8 32768x2048x7168 --moe deepseek
