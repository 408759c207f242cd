# First call on nvidia-h200-x4: the tables that can close issues 3, 4 and 5 (their bars are 4-GPU bars), on the
# code as it is. Self-contained (replaces the chain of sessions 19-22's next_x4.sh files; what those held and this
# file does not is in next_x4_call2.sh / call3.sh).
#   DEADLINE=560 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session23/commands/next_x4_call1.sh
# Put the tables directly in bench/results/<session>/runN/ (check_cost_model.py globs */run*/*_ws*.json).
TR="python -m torch.distributed.run --standalone --nproc-per-node=4"
export OVERLAP_TIMEOUT_S=30
TAILN=3 run info 20 bash -c 'nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv; nvidia-smi topo -m; python -c "import torch,triton; print(torch.__version__, triton.__version__, torch.cuda.nccl.version())"'
# issue 3: every DESIGN shape at ws 4, eager and replayed (async-TP and NCCL + mm in the same run)
TAILN=60 run cg4 210 $TR bench/bench_collective_gemm.py --suite ag_mm,mm_rs,mm_ar --lowerings symm --graphs --out-dir $RES
# issue 4: every default config (DeepSeek-like, Mixtral-like, both decode sizes), balanced and skewed, at EP 4
TAILN=14 run moe4 180 $TR bench/bench_moe.py --out $RES --routing balanced,skewed --comm-sms '' --sweep ce --no-p2p
# issue 5: 2 stages x TP2 against TP4, eager and (new) replayed; one transport and K-chunk count to fit the call
TAILN=14 run cta4 140 $TR bench/bench_cta.py --sizes 512,1024,4096 --graphs --k-chunks 4 --transports ce --micro-batches 2 --out-dir $RES
