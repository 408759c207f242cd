# Session 21, call 2, nvidia-h200 (one GPU), two ranks on it:
#   DEADLINE=330 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session21/commands/stages2_x1.sh
# mm_ar in rounds at calibrate's probe size hung on its first call in call 1 (one rank's own round-1 DONE flag never
# raised): the flag words when it is stuck, the tuned configs, and which sizes / transports do it.
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=60
TAILN=40 run ar_hang 320 python bench/results/2026-12-01_h200x1_session21/commands/mm_ar_hang_debug.py 2048,3584,8192 2048,128,8192 4096,3584,8192 2048,3584,8192,peer
