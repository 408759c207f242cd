# Call 14, one H200: staged tiles counted in batches with pointer stores too (mm_rs.launch(defer=True)).
TAILN=30 run defer 240 python bench/probe_ws.py --shapes 16384x512x8192,4096x1792x8192,8192x3584x8192 --mm-rs 4 --configs 128x256x64x3x8 --rs-defer
TAILN=12 run defer2 120 python bench/probe_ws.py --shapes 8192x3584x8192,16384x1024x8192 --mm-rs 2 --configs 128x256x64x3x8 --rs-defer
TAILN=4 run mmar2 60 python devrun/mm_ar_check2.py
