# For the next session that gets nvidia-h200-x2 (or x4 for the tests): session 21's changes on two GPUs, one GPU per
# rank (only ranks sharing one H200 ran them so far), and the mm_ar copy-out A/B at 2 GPUs.
#   DEADLINE=500 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session21/commands/next_x2.sh
TR="python -m torch.distributed.run --standalone --nproc-per-node=2"
P="python -m pytest -q -s -p no:cacheprovider"
export OVERLAP_TIMEOUT_S=30
TAILN=8 run t_arcopy 120 $P tests/test_gpu.py -k "ws2 and symm-arcopy and (numerics or repeated)"
TAILN=8 run t_growth 60 $P tests/test_gpu.py -k "growth_disagreement or sm_filling or calibrate_measures"
TAILN=30 run cg2_ar 120 $TR bench/bench_collective_gemm.py --suite mm_ar --lowerings symm --out-dir $RES
TAILN=30 run cg2_arcopy 120 $TR bench/bench_collective_gemm.py --suite mm_ar --lowerings symm --out-dir $RES/arcopy --set runtime.symm_lowering.AR_KERNEL_COPY_OUT=True
TAILN=12 run moe2 80 $TR bench/bench_moe.py --out $RES --configs deepseek --routing balanced --comm-sms '' --sweep ce-only --no-p2p
