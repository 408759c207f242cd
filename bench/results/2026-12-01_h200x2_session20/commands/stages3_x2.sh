# Session 20, call 3, nvidia-h200-x2:
#   DEADLINE=330 bash bench/run_stages.sh bench/results/2026-12-01_h200x2_session20/commands/stages3_x2.sh
# Call 2: after the p2p lowering, symm replays (copy-engine-only combine, no comm kernel) are as fast as clean ones
# (6.100 vs 6.095 ms) while eager calls (comm kernel copies the returned rows out) are slow (9.110). Is the comm kernel
# the thing that slows down? The ce-only column (no comm kernel) with and without p2p first.
TR="python -m torch.distributed.run --standalone --nproc-per-node=2"
TAILN=10 run moe_p2pfirst 150 $TR bench/bench_moe.py --out $RES/p2p_first --configs deepseek,mixtral --routing balanced --comm-sms '' --sweep ce-only --p2p-first
TAILN=10 run moe_clean 150 $TR bench/bench_moe.py --out $RES/clean --configs deepseek,mixtral --routing balanced --comm-sms '' --sweep ce-only --no-p2p
