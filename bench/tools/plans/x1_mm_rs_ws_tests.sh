# One GPU (Hopper), a short call: mm_rs's Gluon producer's GPU tests only (staging, band counts, the own chunk's sum
# with late partials, bias / epilogue / average, a wait that gives up), both staging forms; then ag_mm's Gluon
# kernel with its epilogue in shared-memory slices. x1_mm_rs_ws.sh has the benchmarks.
TAILN=16 run rs_ws_tests 150 env PYTHONPATH=.. python -m pytest -q -rA -s -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k "mm_rs_ws"
TAILN=8 run ag_ws_tests 100 env PYTHONPATH=.. python -m pytest -q -rA -s -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k "generated_epilogue and in_shared_slices"
