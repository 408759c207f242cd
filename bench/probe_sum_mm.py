"""Probe (one GPU): a sum of matmuls ``a_1 @ b_1 + ... + a_n @ b_n`` computed three ways.

In the backward of tensor + sequence parallelism the input gradient of projections that read one
gathered tensor (Q/K/V, or SwiGLU's w1/w3) is such a sum, reduce-scattered. The ``mm_rs`` pass
rewrites it as ONE matmul over the concatenated contraction dim, ``cat(a_i, 1) @ cat(b_i, 0)``,
which copies both operands on every step. This times, at the Llama step's local shapes (dim 4096,
q 4096, kv 1024, ffn 14336, 8192 tokens; K split ``ws`` ways):

- ``cat``: the two concatenations + one ``torch.mm`` (what the rewritten graph does today);
- ``accumulate``: ``torch.mm`` of the first term, then ``addmm(out, a_i, b_i)`` into it for the others
  (no copies; what a multi-operand op could do);
- ``separate``: every ``torch.mm`` into its own buffer, then their sum (the unrewritten graph's work,
  unfused);
- ``one mm``: the single matmul alone, operands already concatenated (the lower bound of ``cat``).

Each result is checked against a float32 reference (fresh random inputs, outputs poisoned where
written with ``out=``). Median of CUDA-event timings after warm-up. A diagnostic.

    python bench/probe_sum_mm.py [--ws 1,2,4] [--tokens 8192]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.common import events_ms  # noqa: E402

DIM, Q, KV, FFN = 4096, 4096, 1024, 14336


def _terms(tokens: int, ks: list[int], dev, dtype=torch.bfloat16):
    a = [torch.randn(tokens, k, device=dev).to(dtype) for k in ks]
    b = [(torch.randn(k, DIM, device=dev) / sum(ks) ** 0.5).to(dtype) for k in ks]
    return a, b


def lines_for(name: str, tokens: int, ks: list[int], dev) -> list[str]:
    a, b = _terms(tokens, ks, dev)
    ref = sum(x.float() @ w.float() for x, w in zip(a, b))
    out = torch.empty(tokens, DIM, device=dev, dtype=a[0].dtype)
    a_cat, b_cat = torch.cat(a, 1), torch.cat(b, 0)

    def cat():
        return torch.mm(torch.cat(a, 1), torch.cat(b, 0))

    def accumulate():
        torch.mm(a[0], b[0], out=out)
        for x, w in zip(a[1:], b[1:]):
            torch.addmm(out, x, w, out=out)
        return out

    def separate():
        parts = [torch.mm(x, w) for x, w in zip(a, b)]
        return torch.stack(parts).sum(0) if len(parts) > 2 else parts[0] + parts[1]

    def one_mm():
        return torch.mm(a_cat, b_cat)

    rows = []
    for label, fn in (("cat", cat), ("accumulate", accumulate), ("separate", separate), ("one mm", one_mm)):
        out.fill_(float("nan"))
        got = fn()
        torch.cuda.synchronize()
        err = ((got.float() - ref).norm() / ref.norm()).item()
        if not err <= 1e-2:
            rows.append(f"  {label:10s} WRONG (rel err {err:.2e})")
            continue
        rows.append(f"  {label:10s} {events_ms(fn, n=30, warm=5):.3f} ms (rel err {err:.1e})")
    return [f"{name}: {tokens} tokens, K = {' + '.join(map(str, ks))}, N = {DIM}"] + rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ws", default="1,2,4", help="TP sizes: K of each term split this many ways")
    p.add_argument("--tokens", type=int, default=8192)
    args = p.parse_args()
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}", flush=True)
    for ws in (int(w) for w in args.ws.split(",")):
        for line in lines_for(f"ws {ws} QKV input grad", args.tokens, [Q // ws, KV // ws, KV // ws], dev):
            print(line, flush=True)
        for line in lines_for(f"ws {ws} w1/w3 input grad", args.tokens, [FFN // ws, FFN // ws], dev):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
