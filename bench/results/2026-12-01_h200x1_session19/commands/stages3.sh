# Session 19, call 3 (one H200): why did test_compiled_blocks_fused_vs_eager[ws2-symm] segfault with both
# ranks on one GPU (gloo)? Ranks now print their stack on a fatal signal (faulthandler).
#   DEADLINE=300 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session19/commands/stages3.sh
C=bench/results/2026-12-01_h200x1_session19/commands
TAILN=12 run gloo_cuda 90 python $C/gloo_cuda_collectives.py
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=150
P="python -m pytest -q -s -p no:cacheprovider"
TAILN=60 run sh2_blk 100 $P tests/test_gpu_epilogues.py -k "compiled_blocks_fused_vs_eager and ws2 and symm"
TAILN=20 run sh2_tpm 120 $P tests/test_gpu.py -k "compiled_tp_models and ws2-symm]"
