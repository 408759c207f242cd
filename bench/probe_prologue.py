"""The compute side of the prologue hoist, on one GPU (not a test; no communication is timed).

    python bench/probe_prologue.py [--tokens 8192] [--hidden 4096] [--ws 2 4] [--norm rms layer]

``passes/prologue.py`` turns ``all_gather(x) -> norm(w, b) -> mm(W)`` into ``norm_without_affine(x) ->
ag_mm(., w[:, None] * W, b @ W)``: the norm runs on the shard (1/ws of the rows) and its weight and bias are
folded into the GEMM's weight and bias, once per call. What that costs or saves per rank, without the gather
(which the rewrite overlaps and the original does not), at the TP block's QKV shape (N = 3 * hidden / ws):

- ``before``: the original graph's compute: the norm on the gathered rows, then the GEMM (Inductor);
- ``after``: the rewritten graph's compute: the norm on the shard, the folds, the GEMM on the gathered rows;
- the pieces: ``norm_gathered``, ``norm_shard``, ``fold`` (weight and, for LayerNorm, bias), ``gemm``.

bf16, Inductor-compiled functions (``before`` and ``after`` each one function), replayed from CUDA graphs
and timed with CUDA events after warm-up, median of ``--reps`` runs (GPU time only). One JSON line per
(norm, ws).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


def _time_ms(fn, reps: int) -> float:
    """Median GPU time of ``fn`` replayed from a CUDA graph (no host time: these kernels are short
    and one compiled call's host overhead, ~0.1 ms, would dominate them)."""
    for _ in range(3):
        fn()
    if not torch.cuda.is_available():  # a CPU smoke run of the script (its times mean nothing)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()  # warm-up on the capture stream
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            fn()
    torch.cuda.synchronize()
    for _ in range(5):
        graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _norm(kind: str, x, w=None, b=None):
    if kind == "rms":
        return F.rms_norm(x, (x.shape[-1],), w, 1e-6)
    return F.layer_norm(x, (x.shape[-1],), w, b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192, help="gathered rows")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--ws", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--norm", nargs="+", default=["rms", "layer"], choices=["rms", "layer"])
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    dev, bf, K = ("cuda" if torch.cuda.is_available() else "cpu"), torch.bfloat16, args.hidden
    torch.manual_seed(0)
    for kind in args.norm:
        for ws in args.ws:
            M, N = args.tokens, 3 * K // ws
            xg = torch.randn(M, K, device=dev, dtype=bf)
            x = xg[: M // ws].clone()
            w, b = (1 + 0.1 * torch.randn(K, device=dev)).to(bf), torch.randn(K, device=dev, dtype=bf)
            b = b if kind == "layer" else None
            W = torch.randn(K, N, device=dev, dtype=bf) * K**-0.5

            before = torch.compile(lambda xg: _norm(kind, xg, w, b) @ W)
            norm_gathered = torch.compile(lambda xg: _norm(kind, xg, w, b))
            norm_shard = torch.compile(lambda x: _norm(kind, x).to(bf))

            def fold_fn():
                wf = (W.float() * w.float()[:, None]).to(bf)
                bf_ = (b[None, :] @ W).view(-1) if b is not None else None
                return wf, bf_

            fold = torch.compile(fold_fn)
            wf, bias = fold()
            gemm = (lambda: torch.addmm(bias, xg, wf)) if bias is not None else (lambda: xg @ wf)

            def after_fn(x, xg):  # one compiled function, as the rewritten graph is one
                hat = _norm(kind, x).to(bf)
                wf = (W.float() * w.float()[:, None]).to(bf)
                if b is None:
                    return hat, xg @ wf
                return hat, torch.addmm((b[None, :] @ W).view(-1), xg, wf)  # fold_shift: b @ W in bf16

            after_compiled = torch.compile(after_fn)

            def after():
                return after_compiled(x, xg)

            ref = before(xg).float()
            # (gemm() reads xg in place of the gathered normalised rows: the math is checked here)
            hat = _norm(kind, xg.float()).to(bf)
            got = (torch.addmm(bias, hat, wf) if bias is not None else hat @ wf).float()
            err = ((got - ref).norm() / ref.norm()).item()
            row = {"norm": kind, "ws": ws, "tokens": M, "hidden": K, "n": N, "rel_err_vs_before": round(err, 5)}
            for name, fn in (("before", lambda: before(xg)), ("after", after),
                             ("norm_gathered", lambda: norm_gathered(xg)), ("norm_shard", lambda: norm_shard(x)),
                             ("fold", fold), ("gemm", gemm)):
                row[f"{name}_ms"] = round(_time_ms(fn, args.reps), 4)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
