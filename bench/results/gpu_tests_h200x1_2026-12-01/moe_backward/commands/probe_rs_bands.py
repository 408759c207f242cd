"""One H200: the GEMM side of mm_rs's cuBLAS path at ws 4's local shapes, as a prior for the RS_CUBLAS_MIN_K=512 A/B
of next_x4_call2.sh. At those K the path makes one band per chunk (RS_CUBLAS_BAND_FLOPS), so its GEMMs are ws
cuBLAS calls of M/ws rows each; the Triton kernel (bench/probe_ws.py --mm-rs 4, run in the same call) does the whole
M in one launch. Prints, per (M, K, N): one cuBLAS mm of all M rows, ws mms of M/ws rows back to back (eager and
replayed from a CUDA graph), ms, median of 50 CUDA-event timings; each result checked against float32 first."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import torch  # noqa: E402

from bench.common import events_ms  # noqa: E402

WS = 4
for M, K, N in ((4096, 1792, 8192), (8192, 1792, 8192), (16384, 512, 8192)):
    a = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    b = (torch.randn(K, N, device="cuda") * K**-0.5).to(torch.bfloat16)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    rows = M // WS

    def bands():
        for c in range(WS):
            torch.mm(a[c * rows:(c + 1) * rows], b, out=out[c * rows:(c + 1) * rows])

    bands()
    ref = a.float() @ b.float()
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, err
    whole = events_ms(lambda: torch.mm(a, b), n=50)
    eager = events_ms(bands, n=50)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        bands()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        bands()
    replay = events_ms(g.replay, n=50)
    print(f"{M}x{K}x{N}: cuBLAS whole {whole:.3f} ms | {WS} bands of {rows} rows: eager {eager:.3f}, "
          f"replayed {replay:.3f} ms (rel err {err:.1e})", flush=True)
