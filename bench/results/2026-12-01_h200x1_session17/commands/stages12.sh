# Call 12, one H200: does warp specialization hide an activation epilogue in a plain persistent GEMM
# (the TP block's fc1 at ws 2: 8192x4096x7168), erf GELU and tanh GELU, 128x256 and 128x128 tiles?
TAILN=40 run wsepi 240 python bench/probe_ws.py --shapes 8192x4096x7168,8192x4096x3584 --configs 128x256x64x3x8,128x128x64x4x8 --epilogues none,gelu_erf,gelu
