# Session 22, call 9 (one H200, one rank): bench_prologue.py's CUDA path (Inductor, CUDA-graph capture) before a
# multi-GPU session relies on it. At world size 1 nothing is rewritten (a one-rank group): not a measurement.
TAILN=16 run prologue1 150 python -m torch.distributed.run --standalone --nproc-per-node=1 bench/bench_prologue.py --out-dir $RES --graphs --batch 1 --seq 1024 --hidden 1024 --rounds 1
