# Call 11, one H200: the ag_mm consumer kernel alone, plain and with the TP block's bias + GELU epilogue fused,
# against cuBLAS addmm (+ F.gelu): the TP block's fc1 at ws 2 and 4 (8192 gathered rows, K 4096, N 14336/ws).
TAILN=40 run ag 240 python bench/probe_ws.py --shapes 8192x4096x7168 --ag-mm 2
TAILN=20 run ag4 150 python bench/probe_ws.py --shapes 8192x4096x3584 --ag-mm 4
