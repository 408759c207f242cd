# One GPU: a plain persistent Triton GEMM at mm_rs's / mm_ar's long-K local shapes (4 and 2 GPUs), its tile loop
# plain, drawn from a ticket, flattened, against cuBLAS: whether the 1.1x these kernels measure there is the
# Triton GEMM's own (run_stages runs in bench/).
TAILN=40 run long_k 290 python probes/probe_ws.py --shapes 8192x7168x4096,4096x7168x8192,8192x14336x4096 --configs 128x256x64x3x8 --variants plain,ticket_for,flatten
