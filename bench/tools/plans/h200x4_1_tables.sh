# On nvidia-h200-x4, first call: the 4-GPU tables of the collective GEMMs, the MoE layer and CTA-pipelining on the
# current code (their targets are 4-GPU targets; see docs/limitations.md).
#   DEADLINE=560 bash bench/tools/run_stages.sh bench/tools/plans/h200x4_1_tables.sh
# Put the tables in bench/results/<suite>_h200x4_<date>/runN/ (check_cost_model.py reads <folder>/run*/*_ws*.json).
TR="python -m torch.distributed.run --standalone --nproc-per-node=4"
export OVERLAP_TIMEOUT_S=30
TAILN=3 run info 20 bash -c 'nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv; nvidia-smi topo -m; python -c "import torch,triton; print(torch.__version__, triton.__version__, torch.cuda.nccl.version())"'
# every design shape at ws 4, eager and replayed (async-TP and NCCL + mm in the same run)
TAILN=60 run cg4 210 $TR bench/suites/bench_collective_gemm.py --suite ag_mm,mm_rs,mm_ar --lowerings symm --graphs --out-dir $RES
# every default MoE config (DeepSeek-like, Mixtral-like, both decode sizes), balanced and skewed, at EP 4
TAILN=14 run moe4 180 $TR bench/suites/bench_moe.py --out $RES --routing balanced,skewed --comm-sms '' --sweep ce --no-p2p
# 2 stages x TP2 against TP4, eager and replayed; one transport and K-chunk count to fit the call
TAILN=14 run cta4 140 $TR bench/suites/bench_cta.py --sizes 512,1024,4096 --graphs --k-chunks 4 --transports ce --micro-batches 2 --out-dir $RES
