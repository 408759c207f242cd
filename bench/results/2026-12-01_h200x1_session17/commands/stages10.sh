# Call 10, one H200: the mm_rs kernel with its ticket loop as for-then-while (vs run 5's while loop).
TAILN=30 run rsfor 240 python bench/probe_ws.py --shapes 4096x1792x8192,16384x512x8192,8192x1792x8192 --mm-rs 1,4 --configs 128x256x64x3x8
TAILN=12 run rsfor2 120 python bench/probe_ws.py --shapes 4096x3584x8192,8192x3584x8192,16384x1024x8192 --mm-rs 2 --configs 128x256x64x3x8
TAILN=4 run mmar 90 python bench/results/2026-12-01_h200x1_session17/commands/mm_ar_check.py
