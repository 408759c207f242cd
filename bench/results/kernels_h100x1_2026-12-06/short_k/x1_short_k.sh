# One GPU: a plain persistent Triton GEMM at mm_rs's short-K local shapes (8 and 4 GPUs), its tile loop plain, warp-
# specialized, drawn from a ticket, flattened, against cuBLAS: what the loop itself costs there (run_stages runs in bench/).
TAILN=80 run short_k 400 python probes/probe_ws.py --shapes 16384x512x8192,16384x256x8192,8192x896x8192,8192x512x4096,4096x1792x8192 --configs 128x256x64x3x8,128x256x64x4x8 --variants plain,warp_specialize,ticket_for,flatten,subtile_flatten
