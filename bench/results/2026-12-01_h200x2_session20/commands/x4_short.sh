# If nvidia-h200-x4 appears with under ~500 s of device time left this session: next_x4.sh without the per-peer A/B.
#   DEADLINE=420 bash bench/run_stages.sh bench/results/2026-12-01_h200x2_session20/commands/x4_short.sh
TR="python -m torch.distributed.run --standalone --nproc-per-node=4"
TAILN=3 run info 15 bash -c 'nvidia-smi --query-gpu=name,driver_version --format=csv; python -c "import torch,triton; print(torch.__version__, triton.__version__, torch.cuda.nccl.version())"'
TAILN=60 run cg4 210 $TR bench/bench_collective_gemm.py --suite ag_mm,mm_rs,mm_ar --lowerings symm --graphs --out-dir $RES
TAILN=12 run moe4 170 $TR bench/bench_moe.py --out $RES --configs deepseek,mixtral --routing balanced --comm-sms '' --sweep ce --no-p2p
