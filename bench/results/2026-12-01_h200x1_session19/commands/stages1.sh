# Session 19, call 1 (one H200): the multi-rank GPU tests session 18's caps cut, every rank on the one GPU
# (numerics and protocol, not speed). ws 2 first: it fills the Triton cache the ws-4 runs reuse.
#   DEADLINE=545 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session19/commands/stages1.sh
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=170
P="python -m pytest -q -s -p no:cacheprovider"
TAILN=6 run sh_capt 100 $P tests/test_gpu.py -k captured_symm_ops_replay   # a captured mm_rs on the TMA variant
TAILN=8 run sh2_moe 150 $P tests/test_gpu_moe.py -k "op_numerics and ws2 and symm-ce and not only"
TAILN=8 run sh4_moe 150 $P tests/test_gpu_moe.py -k "op_numerics and ws4 and symm-ce and not only"
TAILN=8 run sh4_cta 150 $P tests/test_gpu_cta.py -k "symm_numerics and ws4"
