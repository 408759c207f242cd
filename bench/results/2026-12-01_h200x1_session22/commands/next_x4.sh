# For the next session that gets nvidia-h200-x4 (first call): session 22's prologue test with one GPU per rank
# (symm and p2p), then session 21's next_x4.sh unchanged.
#   DEADLINE=560 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session22/commands/next_x4.sh
TAILN=8 run t_prologue4 120 python -m pytest -q -s -p no:cacheprovider tests/test_gpu_epilogues.py -k "prologues and ws4"
source bench/results/2026-12-01_h200x1_session21/commands/next_x4.sh
