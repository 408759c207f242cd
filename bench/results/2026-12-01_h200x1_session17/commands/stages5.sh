# Call 5, one H200: the plain persistent GEMM with a static tile loop vs the mm_rs kernel's atomic-ticket
# while loop, at the small-K shapes (is the loop the mm_rs kernel's overhead at ws 1?); then the mm_rs
# kernel at ws 1 and 4 in the same process.
TAILN=40 run ticket 200 python bench/probe_ws.py --shapes 4096x1792x8192,16384x512x8192,4096x8192x8192 --configs 128x256x64x3x8
TAILN=20 run rs14 150 python bench/probe_ws.py --shapes 4096x1792x8192,16384x512x8192 --mm-rs 1,4 --configs 128x256x64x3x8
