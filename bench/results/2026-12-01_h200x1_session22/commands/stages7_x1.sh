# Session 22, call 7 (one H200): probe_prologue again, GPU time from CUDA-graph replays and "after" as one
# compiled function (call 6 timed single compiled calls: their ~0.1 ms of host time hid the kernels).
TAILN=5 run probe_8192 150 python bench/probe_prologue.py --tokens 8192 --hidden 4096 --ws 2 4 --reps 50
TAILN=5 run probe_2048 100 python bench/probe_prologue.py --tokens 2048 --hidden 4096 --ws 2 4 --reps 50
