"""Where a step's GPU time goes, variant against variant: torch.profiler traces of one step each
(``bench_models.py --trace DIR`` writes them), GPU activity summed by category.

    python bench/tools/trace_compare.py DIR/llama_ws2_inductor_rank0.json.gz DIR/llama_ws2_overlap_rank0.json.gz ...
                                  [--top 12]

For each trace (one rank, one step): the span from the first GPU activity to the last, and per category
the summed duration of its activities and the time when one of them runs and nothing else does
(*exclusive*: communication nothing overlaps is exposed, compute alone is the critical path's
compute). Categories, by kernel name: ``gemm`` (cuBLAS / CUTLASS), ``nccl``, ``overlap`` (this
package's Triton kernels: ``*_kernel`` of ``overlap_backend.codegen``), ``triton`` (Inductor's generated
kernels), ``attention`` (flash / efficient / cudnn attention), ``copy`` (memcpy / memset activities and
copy kernels), ``other``. Then the ``--top`` kernels whose summed time differs most between the first
trace and each other one. The point: a rewrite that should hide communication shows whether the
exposed communication fell, and what (GEMM efficiency, copies, new kernels) grew instead.
A diagnostic, not a benchmark: one step, one rank.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
CATEGORIES = ("gemm", "nccl", "overlap", "attention", "triton", "copy", "other")
_OURS = re.compile(r"^(ag_mm|mm_rs|reduce|moe_\w+|gate_up|down|stage0|stage1|tail|collect|begin|bump|epilogue|"
                   r"pointwise|oneshot)\w*_kernel|^(pointwise|reduce)_kernel")
_GEMM = re.compile(r"gemm|cutlass|nvjet|xmma|sm\d+_.*(h|s)\d*gemm|cublas", re.I)
_ATTN = re.compile(r"flash|fmha|attention|cudnn.*sdpa|efficient_attention", re.I)
_COPY = re.compile(r"^Memcpy|^Memset|copy_kernel|CatArrayBatchedCopy|elementwise_kernel.*copy", re.I)


def category(name: str, cat: str) -> str:
    if cat != "kernel" or _COPY.search(name):
        return "copy"
    if "nccl" in name.lower():
        return "nccl"
    if _OURS.search(name):
        return "overlap"
    if _ATTN.search(name):
        return "attention"
    if _GEMM.search(name):
        return "gemm"
    if name.startswith("triton_"):
        return "triton"
    return "other"


def load(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return [e for e in events if e.get("cat") in GPU_CATS and "dur" in e]


def summarize(events: list[dict]) -> dict:
    """{"span_us", "total_us": {cat: us}, "exclusive_us": {cat: us}, "by_kernel": {name: us}, "count"}."""
    if not events:
        return {"span_us": 0.0, "total_us": {}, "exclusive_us": {}, "by_kernel": {}, "count": 0}
    total, by_kernel = defaultdict(float), defaultdict(float)
    points = []  # (time, +1/-1, category)
    for e in events:
        c = category(e["name"], e["cat"])
        t0, dur = float(e["ts"]), float(e["dur"])
        total[c] += dur
        by_kernel[e["name"]] += dur
        points += [(t0, 1, c), (t0 + dur, -1, c)]
    points.sort(key=lambda p: (p[0], p[1]))  # ends before starts at one instant
    exclusive = defaultdict(float)
    running: dict[str, int] = defaultdict(int)
    last = points[0][0]
    for t, step, c in points:
        live = [k for k, n in running.items() if n > 0]
        if len(live) == 1:
            exclusive[live[0]] += t - last
        running[c] += step
        last = t
    span = max(float(e["ts"]) + float(e["dur"]) for e in events) - min(float(e["ts"]) for e in events)
    return {"span_us": span, "total_us": dict(total), "exclusive_us": dict(exclusive), "by_kernel": dict(by_kernel),
            "count": len(events)}


def label(path: Path) -> str:
    return re.sub(r"\.json(\.gz)?$", "", path.name)


def render(paths: list[Path], sums: list[dict], top: int = 12) -> str:
    names = [label(p) for p in paths]
    lines = ["GPU time of one step per category, ms: total (exclusive: nothing else running)", ""]
    lines.append("| category | " + " | ".join(names) + " |")
    lines.append("|---|" + "---|" * len(names))
    lines.append("| span | " + " | ".join(f"{s['span_us'] / 1e3:.3f}" for s in sums) + " |")
    for c in CATEGORIES:
        if not any(s["total_us"].get(c) for s in sums):
            continue
        cells = [f"{s['total_us'].get(c, 0.0) / 1e3:.3f} ({s['exclusive_us'].get(c, 0.0) / 1e3:.3f})" for s in sums]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    lines.append("| activities | " + " | ".join(str(s["count"]) for s in sums) + " |")
    base = sums[0]["by_kernel"]
    for name, s in zip(names[1:], sums[1:]):
        diff = {k: s["by_kernel"].get(k, 0.0) - base.get(k, 0.0) for k in set(base) | set(s["by_kernel"])}
        lines += ["", f"Largest differences, {name} minus {names[0]} (ms, summed over the step):"]
        for k in sorted(diff, key=lambda k: -abs(diff[k]))[:top]:
            lines.append(f"  {diff[k] / 1e3:+8.3f}  {k[:110]}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("traces", nargs="+", type=Path, help="one trace per variant (the first is the base)")
    p.add_argument("--top", type=int, default=12, help="kernels listed per comparison")
    args = p.parse_args(argv)
    sums = [summarize(load(t)) for t in args.traces]
    print(render(args.traces, sums, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
