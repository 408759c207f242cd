# Session 21, call 1, nvidia-h200 (one GPU), every rank on it:
#   DEADLINE=540 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session21/commands/stages1_x1.sh
# 1. The claim_and_report refactor (a6a0fbd: one report writer for a timed-out wait and a row-count mismatch) on
#    real kernels: the symm and MoE timeout tests, the MoE uneven-rows test.
# 2. Where calibrate --host's probes fault (session 20 call 8: illegal memory access), without CUDA_LAUNCH_BLOCKING.
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=150
P="python -m pytest -q -s -p no:cacheprovider"
H=bench/results/2026-12-01_h200x2_session20/commands/host_probe_debug.py
TAILN=10 run probes_seq 130 python $H sequence
TAILN=8 run sh_symm_timeout 100 $P tests/test_gpu.py::test_symm_timeout_names_op_rank_flag
TAILN=8 run sh_moe_timeout 100 $P tests/test_gpu_moe.py::test_moe_timeout_names_op_rank_flag
TAILN=10 run sh_uneven 100 $P tests/test_gpu_moe.py::test_moe_uneven_rows_raise
TAILN=12 run probes_alone 200 python $H alone
