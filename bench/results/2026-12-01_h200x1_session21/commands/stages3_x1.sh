# Session 21, call 3, nvidia-h200 (one GPU), two ranks on it:
#   DEADLINE=240 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session21/commands/stages3_x1.sh
# Call 2: mm_ar in rounds hangs on the copy-engine transport (M=2048 and 4096, K=3584 and 128, N=8192), not with peer
# stores; at M=4096 the context then reports an illegal address. Here: the flag words of the stuck rank (printed by
# the worker itself this time), and whether N=1024 / 4096 (the GPU tests' sizes are small) hang too.
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=60
TAILN=3 run tools 20 bash -c "which compute-sanitizer cuda-gdb nvcc; ls /usr/local/cuda*/bin 2>/dev/null | head"
TAILN=60 run ar_hang 200 python bench/results/2026-12-01_h200x1_session21/commands/mm_ar_hang_debug.py 2048,128,8192 2048,128,1024 2048,128,4096
