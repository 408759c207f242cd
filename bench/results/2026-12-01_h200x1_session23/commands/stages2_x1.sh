# Session 23, call 2 (one H200): moe_experts_backward's CUDA path at ws 1 (torch._grouped_mm on the transposed
# weights, index_add_, the NCCL group of one rank), against autograd through float32 experts.
#   DEADLINE=300 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session23/commands/stages2_x1.sh
TAILN=3 run info 20 bash -c 'nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python -c "import torch,triton; print(torch.__version__, triton.__version__)"'
TAILN=6 run t_moe_bwd1 200 python -m pytest -q -s -p no:cacheprovider tests/test_gpu_moe.py -k "backward_op and ws1"
