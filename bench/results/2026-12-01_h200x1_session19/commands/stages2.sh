# Session 19, call 2 (one H200): issue 8's epilogue GPU tests with every rank on the one GPU, then
# clusters of 2 CTAs (num_ctas=2) on the plain persistent GEMM.
#   DEADLINE=560 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session19/commands/stages2.sh
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=170
P="python -m pytest -q -s -p no:cacheprovider"
TAILN=8 run sh2_epi 130 $P tests/test_gpu_epilogues.py -k "ops_with_epilogues_numerics and ws2 and symm and not peer"
TAILN=8 run sh4_epi 130 $P tests/test_gpu_epilogues.py -k "ops_with_epilogues_numerics and ws4 and symm and not peer"
TAILN=8 run sh2_blk 130 $P tests/test_gpu_epilogues.py -k "compiled_blocks_fused_vs_eager and ws2 and symm"
unset OVERLAP_TEST_SHARED_GPU
TAILN=30 run probe_ctas 120 python bench/probe_ws.py --shapes 4096x8192x28672,1024x8192x28672,8192x4096x7168 --configs 128x256x64x3x8,128x256x64x3x8x2,256x128x64x3x8x2 --epilogues none,gelu --variants plain,flatten
