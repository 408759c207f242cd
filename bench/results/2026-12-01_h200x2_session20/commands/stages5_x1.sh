# Session 20, call 5, nvidia-h200 (one GPU), every rank on it:
#   DEADLINE=330 bash bench/run_stages.sh bench/results/2026-12-01_h200x2_session20/commands/stages5_x1.sh
# The MOE_CAP check (ranks with different row counts of x raise SymmMismatchError instead of returning garbage),
# and that it reports nothing on a normal compiled layer and does not change the timeout test's outcome.
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=200
P="python -m pytest -q -s -p no:cacheprovider"
TAILN=12 run sh_uneven 110 $P tests/test_gpu_moe.py::test_moe_uneven_rows_raise
TAILN=8 run sh_layer 100 $P "tests/test_gpu_moe.py::test_compiled_moe_layer_symm[ws2-dropless-grouped_mm]"
TAILN=8 run sh_timeout 100 $P tests/test_gpu_moe.py::test_moe_timeout_names_op_rank_flag
