# Session 21, call 7, nvidia-h200 (one GPU), every rank on it:
#   DEADLINE=300 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session21/commands/stages7_x1.sh
# The data buffer's growth agreed through the store (bounded): the disagreement test, the MoE uneven-rows test (its
# kernel check, after an equal warm-up), and growth across recompiles and repeated calls (nothing changed there).
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=150
P="python -m pytest -q -s -p no:cacheprovider"
TAILN=8 run sh_growth 100 $P tests/test_gpu.py::test_symm_growth_disagreement_raises_instead_of_hanging
TAILN=6 run sh_uneven 80 $P tests/test_gpu_moe.py::test_moe_uneven_rows_raise
TAILN=6 run sh_recompile 100 $P "tests/test_gpu.py::test_recompiles_reuse_group_state[symm]"
