# One GPU: tiles spanning what was one tile's unit at decode sizes, both off until this runs. mm_rs's tiles spanning
# chunks shorter than a tile (knobs.codegen.RS_SPAN_CHUNKS) and the MoE expert kernels' row tiles spanning an
# expert's sources (knobs.moe.SPAN_SOURCES): their GPU tests (mm_rs at 8 and 2 ranks' decode chunks, the flags
# raised and the partials landing late; the MoE op at 2 ranks sharing the GPU, every routing case, expert-major
# calls spanning), then, only where they passed, the decode cases with the knob on and off in the same call (each
# config's calls alternating with cuBLAS's / torch._grouped_mm's, each result checked against float32).
TAILN=16 run span_test 150 python -m pytest -x -s -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_kernel_variants.py -k "test_mm_rs_tiles_span_short_chunks"
if grep -qE "^[0-9]+ passed" "$W/logs/span_test.log" 2>/dev/null; then
TAILN=14 run rs_span_on 80 python bench/suites/bench_kernels.py --kernels mm_rs --ws 8 --max-rows 512 --budget-s 55 --out $RES/rs_span/on --set codegen.RS_SPAN_CHUNKS=True
TAILN=14 run rs_span_off 80 python bench/suites/bench_kernels.py --kernels mm_rs --ws 8 --max-rows 512 --budget-s 55 --out $RES/rs_span/off --set codegen.RS_SPAN_CHUNKS=False
fi
TAILN=12 run moe_span_test 170 env OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=20 python -m pytest -x -s -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_moe.py -k "test_moe_op_numerics_repeated and ws2-symm-span"
if grep -qE "^[0-9]+ passed" "$W/logs/moe_span_test.log" 2>/dev/null; then
TAILN=20 run moe_span_on 90 python bench/suites/bench_kernels.py --kernels moe_gate_up,moe_down --ws 4,8 --max-rows 1024 --budget-s 70 --out $RES/moe_span/on --set moe.SPAN_SOURCES=True
TAILN=20 run moe_span_off 90 python bench/suites/bench_kernels.py --kernels moe_gate_up,moe_down --ws 4,8 --max-rows 1024 --budget-s 70 --out $RES/moe_span/off --set moe.SPAN_SOURCES=False
fi
