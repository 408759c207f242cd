# Third call on nvidia-h200-x4: the Llama step (issue 6's bar), eager and under graphs; then the MoE decoder's
# training step (both MoE ops rewritten since the twenty-third session) and both bf16 loss curves.
#   DEADLINE=560 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session23/commands/next_x4_call3.sh
TR="python -m torch.distributed.run --standalone --nproc-per-node=4"
export OVERLAP_TIMEOUT_S=30
TAILN=20 run models4 200 $TR bench/bench_models.py --out $RES --sections llama --variants inductor,async_tp,overlap
TAILN=20 run models4_g 150 $TR bench/bench_models.py --out $RES --sections llama --variants inductor,overlap --mode reduce-overhead
TAILN=30 run moe_models4 200 $TR bench/bench_models.py --out $RES/moe --sections mixtral,mixtral_curve,curve --variants inductor,overlap
