# Call 4, one H200: the mm_rs kernel's ticket draws (tiles per draw) and batched counting, at ws 1 (the
# ticket loop alone) and 4, K=1792 and 512; and ws 2 at K=3584.
TAILN=80 run rsvar 240 python bench/probe_ws.py --shapes 4096x1792x8192,16384x512x8192 --mm-rs 1,4 --configs 128x256x64x3x8 --rs-variants 1,1b,2,2b,4b,8b
TAILN=30 run rsvar2 120 python bench/probe_ws.py --shapes 4096x3584x8192,8192x3584x8192 --mm-rs 2 --configs 128x256x64x3x8 --rs-variants 1,2b,4b
