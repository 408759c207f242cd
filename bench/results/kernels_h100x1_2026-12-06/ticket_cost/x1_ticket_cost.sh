# One GPU: what the mm_rs / mm_ar kernels' tile ticket costs at long K, split in its parts: a plain persistent
# Triton GEMM's tile loop static (plain), static in the ticket loop's guarded for (guarded), static but each
# index waiting on an atomic draw (ticket_static), drawn from the ticket (ticket_for: the kernels' loop) and
# static in a while loop; every variant and cuBLAS timed in seven interleaved rounds (run_stages runs in bench/).
# Then the mm_rs kernel itself at 4 GPUs' 8192x7168x4096, its candidate configs, in the same process as cuBLAS.
TAILN=40 run ticket_cost 300 python probes/probe_ws.py --shapes 4096x7168x8192,8192x7168x4096,8192x1792x8192 --configs 128x256x64x3x8 --variants plain,guarded,ticket_static,ticket_for,while --rounds 7
TAILN=20 run mm_rs_kernel 150 python probes/probe_ws.py --shapes 8192x7168x4096,4096x7168x8192 --mm-rs 4
