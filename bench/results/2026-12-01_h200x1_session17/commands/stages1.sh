# Call 1, nvidia-h200 (one GPU): the mm_rs producer kernel alone at issue 3's local shapes (ws 4 and 2),
# pointer stores vs the new TMA variant, against cuBLAS; activation formulations again (noise).
nvidia-smi --query-gpu=name,driver_version --format=csv > $W/logs/gpu.txt 2>&1
TAILN=40 run rs4 170 python bench/probe_ws.py --shapes 4096x1792x8192,8192x1792x8192,16384x512x8192,512x1792x8192 --mm-rs 4
TAILN=40 run rs2 150 python bench/probe_ws.py --shapes 4096x3584x8192,8192x3584x8192,16384x1024x8192 --mm-rs 2
TAILN=40 run epi 150 python bench/probe_ws.py --shapes 4096x8192x28672,1024x8192x28672,512x8192x28672 --configs 128x256x64x3x8 --epilogues none,gelu,gelu_fast,silu,silu_fast --no-ws
