# On nvidia-h200-x4, third call: the Llama step (target: 1.10x Inductor), eager and under CUDA graphs; then the MoE
# decoder's training step (both MoE ops rewritten) and both bf16 loss curves.
#   DEADLINE=560 bash bench/tools/run_stages.sh bench/tools/plans/h200x4_3_models.sh
TR="python -m torch.distributed.run --standalone --nproc-per-node=4"
export OVERLAP_TIMEOUT_S=30
TAILN=20 run models4 200 $TR bench/suites/bench_models.py --out $RES --sections llama --variants inductor,async_tp,overlap
TAILN=20 run models4_g 150 $TR bench/suites/bench_models.py --out $RES --sections llama --variants inductor,overlap --mode reduce-overhead
TAILN=30 run moe_models4 200 $TR bench/suites/bench_models.py --out $RES/moe --sections mixtral,mixtral_curve,curve --variants inductor,overlap
