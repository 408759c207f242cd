# Session 23, call 1 (one H200): the CTA op captured at 2 stages x TP2 (ranks sharing the GPU; never run before:
# bench_cta --graphs now replays that layout at 4 GPUs), and the prior for mm_rs's cuBLAS bands at ws 4's local K.
#   DEADLINE=540 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session23/commands/stages1_x1.sh
TAILN=3 run info 20 bash -c 'nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader; python -c "import torch,triton; print(torch.__version__, triton.__version__)"'
TAILN=14 run sh_cta_graphs4 300 env OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=280 python -m pytest -q -s -p no:cacheprovider "tests/test_gpu_cta.py::test_cta_pipeline_symm_cuda_graphs[ws4]"
TAILN=5 run rs_bands 50 python bench/results/2026-12-01_h200x1_session23/commands/probe_rs_bands.py
TAILN=20 run rs_kernel 150 python bench/probe_ws.py --shapes 4096x1792x8192,8192x1792x8192,16384x512x8192 --mm-rs 4 --configs 128x256x64x3x8
