# For the next session that gets nvidia-h200-x4 (first call). Session 20's next_x4.sh plus, first, the GPU tests of
# session 21's changes at 4 ranks, and the A/B of mm_ar's in-kernel copy-out (AR_KERNEL_COPY_OUT, off by default).
#   DEADLINE=560 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session21/commands/next_x4.sh
# Put the default tables directly in bench/results/<session>/runN/ (check_cost_model.py globs */run*/*_ws*.json).
TR="python -m torch.distributed.run --standalone --nproc-per-node=4"
P="python -m pytest -q -s -p no:cacheprovider"
export OVERLAP_TIMEOUT_S=30
TAILN=3 run info 20 bash -c 'nvidia-smi --query-gpu=name,driver_version --format=csv; nvidia-smi topo -m; python -c "import torch,triton; print(torch.__version__, triton.__version__, torch.cuda.nccl.version())"'
TAILN=8 run t_arcopy 100 $P tests/test_gpu.py -k "ws4 and symm-arcopy and (numerics or repeated)"
TAILN=60 run cg4 210 $TR bench/bench_collective_gemm.py --suite ag_mm,mm_rs,mm_ar --lowerings symm --graphs --out-dir $RES
TAILN=30 run cg4_arcopy 80 $TR bench/bench_collective_gemm.py --suite mm_ar --lowerings symm --out-dir $RES/arcopy --set runtime.symm_lowering.AR_KERNEL_COPY_OUT=True
TAILN=12 run moe4 140 $TR bench/bench_moe.py --out $RES --configs deepseek,mixtral --routing balanced,skewed --comm-sms '' --sweep ce --no-p2p
# Second call: session 20's cg4_perpeer, then the TP block with the backend's defaults (issue 6's "never > 2% slower
# than Inductor"), then session 19's Parts B-F (../2026-12-01_h200x1_session19/commands/next_x4.sh).
# TAILN=30 run cg4_perpeer 90 $TR bench/bench_collective_gemm.py --suite mm_rs,mm_ar --lowerings symm --out-dir $RES/perpeer --set runtime.symm.PUSH_STREAM_PER_PEER=True
# TAILN=20 run block4 150 $TR bench/bench_block.py --out-dir $RES --variants inductor,async_tp,overlap,overlap_symm --rounds 3
