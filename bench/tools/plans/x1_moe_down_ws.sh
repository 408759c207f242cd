# One GPU: the MoE down GEMM's warp-specialized Gluon forms (codegen/moe_down_ws.py): their GPU test (scatter, TMA and
# pointer stores, per-source counting, both weight layouts, both tile orders, two calls on new tensors), then the
# kernel benchmark's moe_down cases at every world size's local shapes, the Gluon forms as bench variants beside the
# op's candidates (only if their test passed: a form that hangs would hold the benchmark to its cap), each config's
# calls alternating with torch._grouped_mm's, each result checked against float32.
TAILN=30 run moe_down_ws_test 230 python -m pytest -x -s -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_kernel_variants.py -k moe_down_ws
if grep -qE "^[0-9]+ passed" "$W/logs/moe_down_ws_test.log" 2>/dev/null; then MOE_VARIANTS=""; else MOE_VARIANTS="--no-variants"; fi
TAILN=24 run moe_down 300 python bench/suites/bench_kernels.py --kernels moe_down --budget-s 230 --out $RES/moe_down $MOE_VARIANTS
