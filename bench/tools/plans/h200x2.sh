# On nvidia-h200-x2 (one call): CTA 2 against TP2 and one GPU / 2 on the current code, eager and replayed; the GPU
# tests that have only run with ranks sharing one GPU, one GPU per rank; both bf16 loss curves (Llama TP+SP and
# Mixtral EP, 300 steps); the prologue benchmark; mm_ar's in-kernel copy-out A/B.
#   DEADLINE=560 bash bench/tools/run_stages.sh bench/tools/plans/h200x2.sh
TR="python -m torch.distributed.run --standalone --nproc-per-node=2"
P="python -m pytest -q -s -p no:cacheprovider"
export OVERLAP_TIMEOUT_S=30
TAILN=14 run cta2 140 $TR bench/suites/bench_cta.py --sizes 512,1024,4096 --graphs --k-chunks 4,8 --transports ce --micro-batches 2,4 --out-dir $RES
TAILN=8 run t2 100 $P tests/gpu/test_gpu.py -k "ws2 and symm-arcopy and (numerics or repeated)"
TAILN=6 run t2_moe_bwd 90 $P tests/gpu/test_gpu_moe.py -k "backward_op and ws2"
TAILN=8 run t2_prologue 60 $P tests/gpu/test_gpu_epilogues.py -k "prologues and ws2"
TAILN=24 run curves2 150 $TR bench/suites/bench_models.py --out $RES --sections curve,mixtral_curve
TAILN=30 run prologue2 90 $TR bench/suites/bench_prologue.py --out-dir $RES --graphs
TAILN=30 run cg2_arcopy 60 $TR bench/suites/bench_collective_gemm.py --suite mm_ar --lowerings symm --out-dir $RES/arcopy --set symm.AR_KERNEL_COPY_OUT=True
