# Session 21, call 5, nvidia-h200 (one GPU), two ranks on it:
#   DEADLINE=120 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session21/commands/stages5_x1.sh
# Call 4: the BN=256 config hangs every time, BN=128 never; when stuck, both ranks' remote tiles are done (DONE) but
# no partial arrived (RS_ARRIVED 0): the pushes never ran. Hypothesis: between two ranks on ONE device the driver
# copies device-to-device with a kernel on the SMs, which the spinning persistent kernel (132 CTAs of 8 warps,
# 144 KB of shared memory each) leaves no room for. Test: the same config with 4 / 16 SMs left free.
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=60
TAILN=40 run ar_hang 110 python bench/results/2026-12-01_h200x1_session21/commands/mm_ar_hang_debug.py 2048,128,8192,ce,bn256,4 2048,128,8192,ce,bn256,16
