# One GPU: mm_rs's tiles spanning chunks shorter than a tile (knobs.codegen.RS_SPAN_CHUNKS, off until this runs): its
# GPU tests (8 and 2 ranks' decode chunks of 32 and 64 rows, every flag raised and the partials landing late), then,
# only if they passed, 8 GPUs' decode case (512 x 896 x 8192, 64-row chunks) with the knob on and off in the same
# call (each config's calls alternating with cuBLAS's, each result checked against float32); then mm_rs's cooperative
# Gluon form in the op at 2 ranks sharing the GPU, and CTA stage 0 with its stream-K forms among its variants.
TAILN=16 run span_test 150 python -m pytest -x -s -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_kernel_variants.py -k "test_mm_rs_tiles_span_short_chunks"
if grep -qE "^[0-9]+ passed" "$W/logs/span_test.log" 2>/dev/null; then
TAILN=14 run span_on 100 python bench/suites/bench_kernels.py --kernels mm_rs --ws 8 --max-rows 512 --budget-s 70 --out $RES/rs_span/on --set codegen.RS_SPAN_CHUNKS=True
TAILN=14 run span_off 100 python bench/suites/bench_kernels.py --kernels mm_rs --ws 8 --max-rows 512 --budget-s 70 --out $RES/rs_span/off --set codegen.RS_SPAN_CHUNKS=False
fi
TAILN=10 run coop_op 80 env OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=15 python -m pytest -x -s -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_kernel_variants.py -k "test_ops_run_the_measured_variant and gluon_coop_both"
TAILN=20 run cta0_variants 150 python bench/suites/bench_kernels.py --kernels cta_stage0 --budget-s 110 --out $RES/cta0_variants
