# Fourth call on nvidia-h200-x4, if the session's device time allows: the GPU tests of sessions 21-23's changes with
# one GPU per rank, and the prologue benchmark.
#   DEADLINE=560 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session23/commands/next_x4_call4.sh
TR="python -m torch.distributed.run --standalone --nproc-per-node=4"
P="python -m pytest -q -s -p no:cacheprovider"
export OVERLAP_TIMEOUT_S=30
TAILN=6 run t4_moe_bwd 90 $P tests/test_gpu_moe.py -k "backward_op and ws4"
TAILN=8 run t4_cta 60 $P tests/test_gpu_cta.py -k "ws4 and graphs"
TAILN=8 run t4 100 $P tests/test_gpu.py -k "ws4 and symm-arcopy and (numerics or repeated)"
TAILN=8 run t4_prologue 60 $P tests/test_gpu_epilogues.py -k "prologues and ws4"
TAILN=30 run prologue4 100 $TR bench/bench_prologue.py --out-dir $RES --graphs
TAILN=10 run moe4_ep 100 $TR bench/bench_moe.py --out $RES/moe_sweep --configs deepseek --routing balanced --comm-sms 0,8 --sweep ce,ce-only --no-p2p
