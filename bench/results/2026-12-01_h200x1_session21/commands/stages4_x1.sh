# Session 21, call 4, nvidia-h200 (one GPU), two ranks on it:
#   DEADLINE=230 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session21/commands/stages4_x1.sh
# Call 3: the same size that hung in call 2 (2048,128,8192) passed, with the ranks' tuning picking different block
# configs. Is it the config (both ranks on BN=256) or a race? Forced configs on both ranks, and repeats.
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=60
TAILN=80 run ar_hang 220 python bench/results/2026-12-01_h200x1_session21/commands/mm_ar_hang_debug.py 2048,128,8192,ce,bn256 2048,128,8192,ce,bn128 2048,128,8192,ce,bn256 2048,3584,8192,ce,bn256 2048,3584,8192 2048,128,8192,ce,bn128
