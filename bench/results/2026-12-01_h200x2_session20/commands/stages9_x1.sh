# Session 20, call 9, nvidia-h200: which host probe crashed in call 8 (each alone, synchronised after every call).
#   DEADLINE=200 bash bench/run_stages.sh bench/results/2026-12-01_h200x2_session20/commands/stages9_x1.sh
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 CUDA_LAUNCH_BLOCKING=1
TAILN=60 run probes 190 python bench/results/2026-12-01_h200x2_session20/commands/host_probe_debug.py
