# Call 3, one H200: where the mm_rs kernel's time over a plain persistent GEMM goes: ws=1 (every tile
# own: the ticket loop alone, no staging, counting or partials) against ws=2/4/8.
TAILN=60 run rsws 200 python bench/probe_ws.py --shapes 4096x1792x8192,16384x512x8192 --mm-rs 1,2,4,8 --configs 128x256x64x3x8
