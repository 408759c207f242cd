"""The cost model's view of the Llama TP + SP training step (CPU, no GPU): how much of the step's
communication the matched ops can hide, by the model's numbers.

Per transformer block the passes match eight GEMM-collective pairs (``overlap_backend.models.llama`` compiled
by ``bench/suites/bench_models.py``; see docs/models.md): forward, the all-gathers into QKV (three weights)
and into w1/w3 (two), the reduce-scatters after wo and w2; backward, the all-gathered output
gradients into wo^T and w2^T, and the reduce-scatters of the input gradients of QKV and w1/w3 (sums
of matmuls, concatenated along K). For each, at each group size, this prints the model's baseline
(GEMM + NCCL collective), its ``symm`` and ``p2p`` predictions and its decision, eagerly (an op's host
time counts: ``max(host, device)``) and replayed from CUDA graphs (no host time), then per step:
the matched ops' collective time (what a perfect overlap could hide) and the predicted saving.

    python bench/tools/predict_llama.py [--ws 2,4] [--llama dim=4096,n_layers=4,...] [--calibration h200]

Sizes: ``bench_models.py``'s Llama defaults (``--llama`` overrides the same keys). Calibration: a
built-in one (``overlap_backend.cost.calibration.DEFAULTS``). A prediction, not a measurement: the
benchmark's step times are what count.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from overlap_backend.cost import calibration as calibrate  # noqa: E402
from overlap_backend.cost.model import Problem, predict  # noqa: E402

LLAMA = dict(dim=4096, n_layers=4, n_heads=32, n_kv_heads=8, ffn_dim=14336, batch=4, seq=2048)


def block_problems(ws: int, dim: int, n_heads: int, n_kv_heads: int, ffn_dim: int, tokens: int,
                   dtype: str = "bfloat16") -> dict[str, Problem]:
    """The eight matches of one block at group size ``ws`` (``Problem``: see cost/model.py)."""
    kv = dim // n_heads * n_kv_heads  # columns of wk (and of wv)
    qkv, f = dim + 2 * kv, ffn_dim
    for name, cols in (("QKV", qkv), ("ffn", f)):
        if cols % ws:
            raise ValueError(f"{name} columns {cols} do not split over {ws} ranks")
    return {
        "fwd ag_mm x -> QKV": Problem("ag_mm", tokens, qkv // ws, dim, dtype, ws, gemms=3),
        "fwd ag_mm x -> w1, w3": Problem("ag_mm", tokens, 2 * f // ws, dim, dtype, ws, gemms=2),
        "fwd mm_rs wo -> RS": Problem("mm_rs", tokens, dim, dim // ws, dtype, ws),
        "fwd mm_rs w2 -> RS": Problem("mm_rs", tokens, dim, f // ws, dtype, ws),
        "bwd ag_mm dy -> wo^T": Problem("ag_mm", tokens, dim // ws, dim, dtype, ws),
        "bwd ag_mm dy -> w2^T": Problem("ag_mm", tokens, f // ws, dim, dtype, ws),
        "bwd mm_rs dQKV @ QKV^T -> RS": Problem("mm_rs", tokens, dim, qkv // ws, dtype, ws),
        "bwd mm_rs d(w1,w3) @ (w1,w3)^T -> RS": Problem("mm_rs", tokens, dim, 2 * f // ws, dtype, ws),
    }


def step_view(ws: int, sizes: dict, cal, cuda_graphs: bool) -> dict:
    """Per-op rows and the per-step totals (ms) for one group size and mode."""
    tokens = sizes["batch"] * sizes["seq"]
    rows, comm, saving = [], 0.0, 0.0
    probs = block_problems(ws, sizes["dim"], sizes["n_heads"], sizes["n_kv_heads"], sizes["ffn_dim"], tokens)
    for name, p in probs.items():
        pred = predict(p, cal, ["symm", "p2p"], cuda_graphs=cuda_graphs)
        plans = {pl.lowering: pl.ms for pl in pred.plans}
        comm += pred.baseline_terms.get("comm_ms", 0.0)
        if pred.wins:
            saving += pred.baseline_ms - pred.best.ms
        rows.append({"op": name, "baseline": pred.baseline_ms, **plans,
                     "decision": f"rewrite ({pred.best.lowering})" if pred.wins else "keep plain"})
    layers = sizes["n_layers"]
    return {"rows": rows, "comm_ms": comm * layers, "saving_ms": saving * layers}


def render(ws: int, mode: str, view: dict) -> str:
    out = [f"### ws {ws}, {mode}", "", "| op (per block) | baseline | symm | p2p | decision |", "|---|---|---|---|---|"]
    for r in view["rows"]:
        out.append(f"| {r['op']} | {r['baseline']:.3f} | {r.get('symm', float('nan')):.3f} | "
                   f"{r.get('p2p', float('nan')):.3f} | {r['decision']} |")
    out += ["", f"Per step: the matched ops' collectives {view['comm_ms']:.1f} ms (all a perfect overlap could hide); "
                f"predicted saving {view['saving_ms']:.1f} ms.", ""]
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ws", default="2,4", help="group sizes, comma-separated (default 2,4)")
    p.add_argument("--llama", default="", help="key=value overrides of " + ", ".join(LLAMA))
    p.add_argument("--calibration", default="h200", choices=sorted(calibrate.DEFAULTS),
                   help="built-in calibration (default h200)")
    args = p.parse_args(argv)
    sizes = dict(LLAMA)
    for kv in filter(None, args.llama.split(",")):
        key, _, value = kv.partition("=")
        if key not in sizes:
            p.error(f"--llama: unknown key {key!r} (keys: {', '.join(sizes)})")
        sizes[key] = int(value)
    cal = calibrate.DEFAULTS[args.calibration]
    print(f"Llama {sizes}, calibration {cal.key}, ms\n")
    for ws in (int(w) for w in args.ws.split(",")):
        for mode, graphs in (("eager (host time counts)", False), ("CUDA-graph replays", True)):
            print(render(ws, mode, step_view(ws, sizes, cal, graphs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
