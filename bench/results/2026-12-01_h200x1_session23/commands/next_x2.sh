# On nvidia-h200-x2 (one call): GPU tests of sessions 21-23's changes with one GPU per rank, the prologue benchmark,
# the mm_ar copy-out A/B, and the CTA bar at 2 GPUs on the current code (issue 5's 2-GPU half).
#   DEADLINE=560 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session23/commands/next_x2.sh
TR="python -m torch.distributed.run --standalone --nproc-per-node=2"
P="python -m pytest -q -s -p no:cacheprovider"
export OVERLAP_TIMEOUT_S=30
TAILN=8 run t2 120 $P tests/test_gpu.py -k "ws2 and symm-arcopy and (numerics or repeated)"
TAILN=8 run t2_prologue 80 $P tests/test_gpu_epilogues.py -k "prologues and ws2"
TAILN=30 run prologue2 120 $TR bench/bench_prologue.py --out-dir $RES --graphs
TAILN=30 run cg2_arcopy 80 $TR bench/bench_collective_gemm.py --suite mm_ar --lowerings symm --out-dir $RES/arcopy --set runtime.symm_lowering.AR_KERNEL_COPY_OUT=True
TAILN=14 run cta2 140 $TR bench/bench_cta.py --sizes 512,1024,4096 --graphs --k-chunks 4,8 --transports ce --micro-batches 2,4 --out-dir $RES
