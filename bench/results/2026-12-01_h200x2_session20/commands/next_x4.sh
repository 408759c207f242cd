# For the next session that gets nvidia-h200-x4: one call that gives issue 3 its closing table on the current code
# (ag_mm on cuBLAS per chunk since session 16, mm_rs's TMA variant since 18; session 15's table predates both),
# the per-peer push streams A/B, and issue 4's EP-4 table with the new MoE default (no comm kernel) against the
# old one (8 comm SMs, the sweep's "ce" column), symm only (no p2p in the process: docs/moe.md).
#   DEADLINE=545 bash bench/run_stages.sh bench/results/2026-12-01_h200x2_session20/commands/next_x4.sh
# Put the default tables directly in bench/results/<session>/runN/ (check_cost_model.py globs */run*/*_ws*.json).
TR="python -m torch.distributed.run --standalone --nproc-per-node=4"
TAILN=3 run info 20 bash -c 'nvidia-smi --query-gpu=name,driver_version --format=csv; nvidia-smi topo -m; python -c "import torch,triton; print(torch.__version__, triton.__version__, torch.cuda.nccl.version())"'
TAILN=60 run cg4 210 $TR bench/bench_collective_gemm.py --suite ag_mm,mm_rs,mm_ar --lowerings symm --graphs --out-dir $RES
TAILN=30 run cg4_perpeer 90 $TR bench/bench_collective_gemm.py --suite mm_rs,mm_ar --lowerings symm --out-dir $RES/perpeer --set runtime.symm.PUSH_STREAM_PER_PEER=True
TAILN=12 run moe4 170 $TR bench/bench_moe.py --out $RES --configs deepseek,mixtral --routing balanced,skewed --comm-sms '' --sweep ce --no-p2p
# Second call, if there is one: the TP block with the backend's defaults (issue 6's "never > 2% slower than Inductor"),
# then the rest of session 19's next_x4.sh (Parts B-F: Llama traced, OVERLAP_COST_MODEL=off, issue 8's TP block
# under graphs x3, the decode MoE configs).
# TAILN=20 run block4 150 $TR bench/bench_block.py --out-dir $RES --variants inductor,async_tp,overlap,overlap_symm --rounds 3
