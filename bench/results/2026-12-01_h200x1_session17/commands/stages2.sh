# Call 2, one H200: is the mm_rs kernel's gap at small K Triton's persistent GEMM at that K (plain kernel,
# with / without warp specialization), and which block configs help the mm_rs kernel there.
TAILN=60 run plain 200 python bench/probe_ws.py --shapes 4096x1792x8192,16384x512x8192,4096x3584x8192 --configs 128x256x64x3x8,128x256x64x4x8,128x256x128x2x8,256x128x64x3x8,128x128x64x4x4
TAILN=40 run rs4cfg 200 python bench/probe_ws.py --shapes 4096x1792x8192,16384x512x8192 --mm-rs 4 --configs 128x256x64x4x8,128x256x128x2x8,256x128x64x3x8,128x128x128x3x4,128x256x32x5x8
