# For the next session with one H200 only:
#   DEADLINE=545 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session18/commands/next_x1.sh
# 1) The multi-rank GPU tests this session's caps cut, with every rank on the one GPU (numerics, not speed).
#    ws 2 first: it fills the Triton cache that the ws-4 runs then reuse.
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=170
P="python -m pytest -q -s -p no:cacheprovider"
TAILN=8 run sh2_moe 150 $P tests/test_gpu_moe.py -k "op_numerics and ws2 and symm-ce and not only"
TAILN=8 run sh4_moe 180 $P tests/test_gpu_moe.py -k "op_numerics and ws4 and symm-ce and not only"
TAILN=6 run sh_capt 100 $P tests/test_gpu.py -k captured_symm_ops_replay   # now with a captured mm_rs on the TMA variant
TAILN=8 run sh4_cta 150 $P tests/test_gpu_cta.py -k "symm_numerics and ws4"
# 2) Would clusters of 2 CTAs (num_ctas=2: TMA multicast of the shared operand) close the plain Triton
#    GEMM's gap to cuBLAS at the CTA op's large shape (1.07-1.08x at 4096x8192x28672, this session)?
TAILN=30 run probe_ctas 90 python bench/probe_ws.py --shapes 4096x8192x28672,1024x8192x28672,8192x4096x7168 --configs 128x256x64x3x8,128x256x64x3x8x2,256x128x64x3x8x2 --epilogues none,gelu --variants plain,flatten
