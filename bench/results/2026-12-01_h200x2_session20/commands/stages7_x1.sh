# Session 20, call 7, nvidia-h200 (one GPU), every rank on it:
#   DEADLINE=230 bash bench/run_stages.sh bench/results/2026-12-01_h200x2_session20/commands/stages7_x1.sh
# The op numerics on the copy-engine-only combine (the default's path; 6 calls per case) with the MOE_CAP check,
# every routing case and dtype pair at 2 ranks: no false report.
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=220
P="python -m pytest -q -s -p no:cacheprovider"
TAILN=6 run sh_numerics 220 $P "tests/test_gpu_moe.py::test_moe_op_numerics_repeated[ws2-symm-ce-only]"
