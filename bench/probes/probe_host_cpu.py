"""Probe (CPU, no GPU): the Python host time of a ``symm`` op call, with the CUDA layer mocked.

A ``symm`` call's host time (0.3–0.75 ms measured on the H200 hosts, ``bench/probes/probe_host.py``) is its own
Python, the driver calls it queues (stream writes / waits, copies) and the kernels / cuBLAS launches.
Only the first can be worked on without a GPU, and this measures it: the real ``runtime/symm`` lowering code
runs against a stand-in ``GroupState`` (real ``begin`` / ``push`` / ``end``) whose stream operations
only count, on CPU tensors with tiny GEMMs (their ``torch.mm`` shows as the reference line). Printed
per op: µs per call (median of 200), the driver calls per call by kind, and with ``--profile`` the top
functions by own time.

    python bench/probes/probe_host_cpu.py [--ws 4] [--rows 512] [--profile]

It runs the cuBLAS paths (``ag_mm`` and ``mm_rs`` per chunk, the eager defaults at these shapes on
GPUs); the Triton kernels' launches are not modelled. A diagnostic, not a benchmark of record.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from overlap_backend.runtime import cuda as _cuda  # noqa: E402
from overlap_backend.runtime import symm  # noqa: E402
from overlap_backend.runtime.symm import ag_mm as symm_ag_mm  # noqa: E402
from overlap_backend.runtime.symm import mm_rs as symm_mm_rs  # noqa: E402

STREAM_OPS = ("write_value32", "wait_value32", "memcpy_async")


class _Stream:
    """Stands in for a torch.cuda.Stream: joins are counted."""

    def __init__(self, counts: dict):
        self.counts = counts

    def wait_stream(self, other) -> None:
        self.counts["wait_stream"] = self.counts.get("wait_stream", 0) + 1


def mocked(ws: int, rank: int = 0):
    """Patch the CUDA layer and the group lookup; returns (state, counts, undo)."""
    counts: dict[str, int] = {}
    saved = []

    def patch(obj, name, value):
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    def counter(name):
        def op(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
        return op

    for name in STREAM_OPS:
        patch(_cuda, name, counter(name))
    st = symm.GroupState.host_only(rank, ws)
    st.flags = SimpleNamespace(ptrs=[p << 24 for p in range(ws)], local=rank << 24)
    st.data = SimpleNamespace(ptrs=[p << 32 for p in range(ws)], nbytes=1 << 30)
    st.push_stream, st.copy_stream = _Stream(counts), _Stream(counts)
    st.device, st._watch_progress = SimpleNamespace(index=0), True
    st.num_sms, st.status_ptr, st._status_arg = 132, 0, (0, 0)
    backing = torch.empty(1 << 24, dtype=torch.int8)

    def data_view(dtype, shape, offset_bytes=0):
        n = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        return backing[offset_bytes:offset_bytes + n].view(dtype).view(shape)

    st.data_view, st.ensure_data = data_view, lambda nbytes, op="": None
    compute = _Stream(counts)
    patch(torch.cuda, "current_stream", lambda device=None: compute)
    for module in (symm_mm_rs, symm_ag_mm):
        patch(module, "call_state", lambda group_name, device, graph: (st, None))
    patch(symm_mm_rs, "mm_problem", lambda *a: None)
    patch(symm_ag_mm, "ag_mm_problem", lambda *a: None)
    patch(symm_mm_rs, "group_size", lambda group_name: ws)
    patch(symm_mm_rs, "rs_gemm", lambda *a, **k: "cublas")
    patch(symm_ag_mm, "ag_gemm", lambda *a, **k: "cublas")

    def undo():
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)

    return st, counts, undo


def measure(ws: int, rows: int, profile: bool = False, calls: int = 200) -> dict:
    """{op: {"us": median µs per call, "stream_ops": {kind: per call}, "profile": text or None}}."""
    st, counts, undo = mocked(ws)
    try:
        K, N = 8, 16  # tiny GEMMs: the host's work, not the GEMM's
        a = torch.randn(ws * rows, K)
        b = torch.randn(K, N)
        shard = torch.randn(rows, K)
        ops = {
            "torch.mm (reference)": lambda: torch.mm(a, b),
            "mm_rs (cuBLAS per band)": lambda: symm_mm_rs.mm_rs(a, b, None, [ws * rows, N], 0, "sum", "g"),
            "ag_mm (cuBLAS per chunk)": lambda: symm_ag_mm.ag_mm(shard, [b], [None], 0, "g", True),
        }
        out = {}
        for name, fn in ops.items():
            for _ in range(10):
                fn()
            counts.clear()
            times = []
            for _ in range(calls):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            per_call = {k: v / calls for k, v in sorted(counts.items())}
            text = None
            if profile:
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(calls):
                    fn()
                prof.disable()
                buf = io.StringIO()
                pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(12)
                text = buf.getvalue()
            out[name] = {"us": statistics.median(times) * 1e6, "stream_ops": per_call, "profile": text}
        return out
    finally:
        undo()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ws", type=int, default=4, help="group size (this process plays rank 0)")
    p.add_argument("--rows", type=int, default=512, help="rows per rank's chunk (512: a decode-size call)")
    p.add_argument("--profile", action="store_true", help="also the top functions by own time (cProfile)")
    args = p.parse_args(argv)
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, ws {args.ws}, {args.rows} rows per chunk")
    for name, res in measure(args.ws, args.rows, args.profile).items():
        ops = ", ".join(f"{k} {v:g}" for k, v in res["stream_ops"].items()) or "none"
        print(f"{name}: {res['us']:.1f} us per call; per call: {ops}")
        if res["profile"]:
            print(res["profile"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
