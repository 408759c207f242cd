# One GPU: the ops running a measured variant (ag_mm's Gluon kernel with a fused bias + GELU among them, whose TMA
# stores after the epilogue are now fenced before the partition barrier), every kernel variant's GPU tests, CTA
# stage 1 at decode sizes with its decode config in deeper pipelines (more of the weights' stream in flight per SM:
# 6 stages of BK 64, 3 of BK 128, against the 4 of the knob in the same kind of run), where its time goes at 8 GPUs'
# decode size (its SMs are active 64 % of its duration: Nsight Compute's warp-stall samples per source line and SASS
# instruction of one steady-state launch), then the smoke set.
TAILN=8 run measured_variant 120 env OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -s -p no:cacheprovider -m gpu tests/gpu/test_gpu_kernel_variants.py -k measured_variant
TAILN=6 run variants_test 160 python -m pytest -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_kernel_variants.py -k "not measured_variant"
SWEEP="python bench/suites/bench_kernels.py --kernels cta_stage1 --max-rows 128 --no-variants --budget-s 50"
TAILN=8 run cta1_s4 60 $SWEEP --out $RES/cta1_decode_s4
TAILN=8 run cta1_s6 60 $SWEEP --out $RES/cta1_decode_s6 --set "cta.STAGE1_CONFIG_DECODE=(128,128,64,0,6,8)"
TAILN=8 run cta1_bk128 60 $SWEEP --out $RES/cta1_decode_bk128 --set "cta.STAGE1_CONFIG_DECODE=(128,128,128,0,3,8)"
NCU="ncu --clock-control none --nvtx --nvtx-include run_case/ --launch-skip 1 --launch-count 1 -k regex:stage1_kernel --section SourceCounters --section WarpStateStats --section SpeedOfLight --import-source yes"
TAILN=4 run cta1_source 90 $NCU --page source --csv --print-source cuda,sass --log-file $RES/cta1_ws8_128_source.csv python bench/probes/run_case.py cta_stage1 8 128x28672x2048
TAILN=8 run smoke 100 env OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -n 3 -m gpu_smoke tests/gpu
