# For the next session that gets nvidia-h200-x2 (first call): session 22's prologue test with one GPU per rank
# (symm and p2p), bench_prologue.py (the hoist against plain Inductor, eager and CUDA graphs), then session 21's next_x2.sh unchanged.
#   DEADLINE=560 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session22/commands/next_x2.sh
TAILN=8 run t_prologue2 120 python -m pytest -q -s -p no:cacheprovider tests/test_gpu_epilogues.py -k "prologues and ws2"
TAILN=30 run prologue2 150 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_prologue.py --out-dir $RES --graphs
source bench/results/2026-12-01_h200x1_session21/commands/next_x2.sh
