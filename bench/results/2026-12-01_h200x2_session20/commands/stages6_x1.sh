# Session 20, call 6, nvidia-h200 (one GPU), every rank on it:
#   DEADLINE=150 bash bench/run_stages.sh bench/results/2026-12-01_h200x2_session20/commands/stages6_x1.sh
# Captured moe_experts replays with the MOE_CAP write (a stream write baked into the graph) and check.
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=200
P="python -m pytest -q -s -p no:cacheprovider"
TAILN=10 run sh_captured 140 $P tests/test_gpu_moe.py -k captured_moe_experts_replay
