# Session 23, call 3 (one H200, ranks sharing it): the moe pass after this session's refactor (the compiled MoE layer
# on symm, inference, every form), and the CTA op captured at 2 stages x TP4 (8 ranks).
#   DEADLINE=540 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session23/commands/stages3_x1.sh
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=280
TAILN=10 run sh_moe_compiled 280 python -m pytest -q -s -p no:cacheprovider tests/test_gpu_moe.py -k "compiled_moe_layer_symm and ws2"
TAILN=12 run sh_cta_graphs8 250 python -m pytest -q -s -p no:cacheprovider "tests/test_gpu_cta.py::test_cta_pipeline_symm_cuda_graphs[ws8]"
