# Session 22, call 6 (one H200): the compute side of the prologue hoist (norm on the shard + folds vs the
# norm on the gathered rows), TP block QKV shapes; no communication timed.
TAILN=5 run probe_8192 150 python bench/probe_prologue.py --tokens 8192 --hidden 4096 --ws 2 4 --reps 50
TAILN=5 run probe_2048 100 python bench/probe_prologue.py --tokens 2048 --hidden 4096 --ws 2 4 --reps 50
