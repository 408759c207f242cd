# Call 13, one H200: the residual add fused into the mm_rs kernel's own tiles vs the kernel then torch.add,
# at the TP block's fc2 (8192 rows, K 14336/ws, N 4096), ws 2 and 4.
TAILN=20 run rsadd2 200 python bench/probe_ws.py --shapes 8192x7168x4096 --mm-rs 2 --configs 128x256x64x3x8 --rs-residual-add
TAILN=20 run rsadd4 150 python bench/probe_ws.py --shapes 8192x3584x4096 --mm-rs 4 --configs 128x256x64x3x8 --rs-residual-add
