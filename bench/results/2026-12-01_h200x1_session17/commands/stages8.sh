# Call 8, one H200: the plain persistent GEMM's tile loop: static for / static while / atomic-ticket while.
TAILN=30 run loops 200 python bench/probe_ws.py --shapes 4096x1792x8192,16384x512x8192 --configs 128x256x64x3x8
