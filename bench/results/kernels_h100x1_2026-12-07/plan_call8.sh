# One GPU: the Gluon kernels' generated epilogue as a loop over pieces of the tile in shared memory (not unrolled):
# the GPU tests of both Gluon kernels' epilogues and staging; Nsight Compute's stall reasons of ag_mm's ping-pong
# kernel with bias + GELU; ag_mm and mm_rs with their Gluon forms as their only variants (the knob's default values a
# thread); ag_mm at 4 GPUs' shapes with 8 and 32 values a thread.
AGV="codegen.VARIANTS_16BIT={'ag_mm': ((128,128,64,8,4,4,'ws_pingpong'),(128,256,64,8,3,4,'ws_coop'))}"
RSV="codegen.VARIANTS_16BIT={'mm_rs': ((128,128,64,8,4,4,'ws_pingpong'),(128,128,64,8,4,4,'ws_pingpong_direct'))}"
NCU="ncu --clock-control none --nvtx --nvtx-include run_case/ --launch-skip 1 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --csv --page details"
TAILN=12 run ws_tests 200 python -m pytest -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_kernel_variants.py -k "mm_rs_ws or ws_generated_epilogue"
TAILN=3 run ws_gelu_ncu 60 $NCU -k regex:ag_mm_ws_kernel --log-file $RES/ag_ws_pingpong_gelu.csv python bench/probes/run_case.py ag_mm 4 8192x4096x3584 --epilogue gelu --config "(128,128,64,8,4,4,'ws_pingpong')"
TAILN=14 run ag_kernels 140 python bench/suites/bench_kernels.py --out $RES/ag_ws --kernels ag_mm --budget-s 100 --set "$AGV"
TAILN=8 run rs_kernels 130 python bench/suites/bench_kernels.py --out $RES/rs_ws --kernels mm_rs --budget-s 90 --set "$RSV"
TAILN=6 run ag_values8 60 python bench/suites/bench_kernels.py --out $RES/ag_ws4_values8 --kernels ag_mm --ws 4 --budget-s 35 --set "$AGV" --set codegen.GLUON_EPILOGUE_VALUES=8
TAILN=6 run ag_values32 60 python bench/suites/bench_kernels.py --out $RES/ag_ws4_values32 --kernels ag_mm --ws 4 --budget-s 35 --set "$AGV" --set codegen.GLUON_EPILOGUE_VALUES=32
