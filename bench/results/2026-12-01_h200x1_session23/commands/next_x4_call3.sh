# Third call on nvidia-h200-x4: the Llama step (issue 6's bar), both bf16 loss curves, then the GPU tests of sessions 21-23's changes
# with one GPU per rank, and the prologue benchmark.
#   DEADLINE=560 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session23/commands/next_x4_call3.sh
TR="python -m torch.distributed.run --standalone --nproc-per-node=4"
P="python -m pytest -q -s -p no:cacheprovider"
export OVERLAP_TIMEOUT_S=30
TAILN=20 run models4 200 $TR bench/bench_models.py --out $RES --sections llama --variants inductor,async_tp,overlap
TAILN=20 run models4_g 160 $TR bench/bench_models.py --out $RES --sections llama --variants inductor,overlap --mode reduce-overhead
TAILN=24 run curves4 150 $TR bench/bench_models.py --out $RES/curves --sections curve,mixtral_curve
TAILN=8 run t4 100 $P tests/test_gpu.py -k "ws4 and symm-arcopy and (numerics or repeated)"
TAILN=8 run t4_cta 60 $P tests/test_gpu_cta.py -k "ws4 and graphs"
TAILN=6 run t4_moe_bwd 90 $P tests/test_gpu_moe.py -k "backward_op and ws4"
TAILN=8 run t4_prologue 60 $P tests/test_gpu_epilogues.py -k "prologues and ws4"
TAILN=30 run prologue4 100 $TR bench/bench_prologue.py --out-dir $RES --graphs
