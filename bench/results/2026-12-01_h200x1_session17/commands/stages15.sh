# Call 15, one H200: the mm_rs kernel after its tile function derives its tile counts itself (review mend):
# numerics and time as run 10; the mm_ar form.
TAILN=12 run rsmend 200 python bench/probe_ws.py --shapes 16384x512x8192,4096x1792x8192 --mm-rs 4 --configs 128x256x64x3x8
TAILN=4 run mmar3 90 python bench/results/2026-12-01_h200x1_session17/commands/mm_ar_check.py
