# On nvidia-h200-x4, fourth call if the device time allows: the GPU tests that have only run with ranks sharing one
# GPU (the MoE backward op, 2 stages x TP2 captured, mm_ar's in-kernel copy-out, the prologues), one GPU per rank;
# the prologue benchmark; a MoE sweep of the comm SMs.
#   DEADLINE=560 bash bench/tools/run_stages.sh bench/tools/plans/h200x4_4_tests.sh
TR="python -m torch.distributed.run --standalone --nproc-per-node=4"
P="python -m pytest -q -s -p no:cacheprovider"
export OVERLAP_TIMEOUT_S=30
TAILN=6 run t4_moe_bwd 90 $P tests/gpu/test_gpu_moe.py -k "backward_op and ws4"
TAILN=8 run t4_cta 60 $P tests/gpu/test_gpu_cta.py -k "ws4 and graphs"
TAILN=8 run t4 100 $P tests/gpu/test_gpu.py -k "ws4 and symm-arcopy and (numerics or repeated)"
TAILN=8 run t4_prologue 60 $P tests/gpu/test_gpu_epilogues.py -k "prologues and ws4"
TAILN=30 run prologue4 100 $TR bench/suites/bench_prologue.py --out-dir $RES --graphs
TAILN=10 run moe4_ep 100 $TR bench/suites/bench_moe.py --out $RES/moe_sweep --configs deepseek --routing balanced --comm-sms 0,8 --sweep ce,ce-only --no-p2p
