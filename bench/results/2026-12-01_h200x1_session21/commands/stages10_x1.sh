# Session 21, call 10, nvidia-h200 (one GPU), two ranks on it:
#   DEADLINE=240 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session21/commands/stages10_x1.sh
# moe_experts' first launch now waits for its own rows' copy on the stream when it takes them (the expert-major
# single launch at small sizes, which these tests run): the row-count check, the timeout, and the op numerics.
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=150
P="python -m pytest -q -s -p no:cacheprovider"
TAILN=4 run sh_uneven 45 $P tests/test_gpu_moe.py::test_moe_uneven_rows_raise
TAILN=4 run sh_timeout 45 $P tests/test_gpu_moe.py::test_moe_timeout_names_op_rank_flag
TAILN=8 run sh_numerics 150 $P "tests/test_gpu_moe.py::test_moe_op_numerics_repeated[ws2-symm-ce-only]"
