# Session 19, call 4 (one H200): the compiled and captured GPU tests that can run with both ranks on the one GPU
# (their models use all_reduce / all_to_all, which gloo takes on CUDA tensors), exercising the passes'
# lowering choice (session 18: p2p refused for CUDA tensors on gloo) on a GPU for the first time.
#   DEADLINE=560 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session19/commands/stages4.sh
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=150
P="python -m pytest -q -s -p no:cacheprovider"
TAILN=6 run sh_recomp 70 $P "tests/test_gpu.py::test_recompiles_reuse_group_state[symm]"
TAILN=10 run sh_cta_comp 120 $P "tests/test_gpu_cta.py::test_cta_pipeline_symm_compiled[ws2]"
TAILN=10 run sh_moe_comp 120 $P "tests/test_gpu_moe.py::test_compiled_moe_layer_symm[ws2-dropless-grouped_mm]"
TAILN=6 run sh_timeouts 70 $P tests/test_gpu.py::test_symm_timeout_names_op_rank_flag tests/test_gpu_moe.py::test_moe_timeout_names_op_rank_flag
TAILN=10 run sh_moe_capt 100 $P tests/test_gpu_moe.py -k captured_moe_experts_replay
TAILN=10 run sh_cta_graphs 100 $P "tests/test_gpu_cta.py::test_cta_pipeline_symm_cuda_graphs[ws2]"
