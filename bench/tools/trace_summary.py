"""Summary of torch.profiler traces of one op on several ranks: each GPU activity (kernels, copies,
memsets) per rank on one time axis, and per call the span from the first activity of any rank to
the last. Both ranks' GPU timestamps are converted by CUPTI to the host clock of one machine, so
they line up to within a few microseconds.

    python bench/tools/trace_summary.py TRACE_rank0.json[.gz] TRACE_rank1.json[.gz] [--calls-by stage0_kernel]

Consecutive copies on one stream are merged into one line (count, total bytes time). A diagnostic.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from pathlib import Path

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def load(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return [e for e in events if e.get("cat") in GPU_CATS and "dur" in e]


def rank_of(path: Path) -> str:
    m = re.search(r"rank(\d+)", path.name)
    return m.group(1) if m else path.stem


def merged(events: list[dict]) -> list[tuple[float, float, str, int, int]]:
    """(start, end, name, stream, count): runs of same-named activities on one stream merged."""
    out: list[list] = []
    for e in sorted(events, key=lambda e: e["ts"]):
        name, tid, t0, t1 = e["name"], e["tid"], e["ts"], e["ts"] + e["dur"]
        last = next((o for o in reversed(out) if o[3] == tid), None)
        if last is not None and last[2] == name and name.startswith("Memcpy") and out[-1] is last:
            last[1], last[4] = max(last[1], t1), last[4] + 1
        else:
            out.append([t0, t1, name, tid, 1])
    return [tuple(o) for o in out]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("traces", nargs="+", type=Path)
    p.add_argument("--calls-by", default="stage0_kernel",
                   help="a kernel name launched once per call (on any rank): splits the timeline into calls")
    args = p.parse_args()
    per_rank = {rank_of(t): load(t) for t in args.traces}
    t_zero = min(e["ts"] for evs in per_rank.values() for e in evs)
    starts = sorted(e["ts"] for evs in per_rank.values() for e in evs if e["name"].startswith(args.calls_by))
    # one call per launch of the marker kernel on the rank that launches it first
    first_rank = min(per_rank, key=lambda r: min((e["ts"] for e in per_rank[r] if e["name"].startswith(args.calls_by)),
                                                 default=float("inf")))
    bounds = sorted(e["ts"] for e in per_rank[first_rank] if e["name"].startswith(args.calls_by)) or starts[:1]
    bounds.append(float("inf"))
    for c in range(len(bounds) - 1):
        lo, hi = bounds[c] - 50.0, bounds[c + 1] - 50.0  # a little before the marker: the other rank's first kernel
        rows = []
        for r, evs in sorted(per_rank.items()):
            for t0, t1, name, tid, n in merged([e for e in evs if lo <= e["ts"] < hi]):
                rows.append((t0, t1, r, name, tid, n))
        if not rows:
            continue
        span0, span1 = min(r[0] for r in rows), max(r[1] for r in rows)
        print(f"call {c}: {span1 - span0:8.1f} us from the first GPU activity of any rank to the last")
        for t0, t1, r, name, tid, n in sorted(rows):
            what = f"{name[:40]}" + (f" x{n}" if n > 1 else "")
            print(f"  rank {r} stream {tid:>3}  {t0 - span0:8.1f} .. {t1 - span0:8.1f}  ({t1 - t0:7.1f} us)  {what}")
    print(f"(times in us; t=0 of call 0 is {span0 - t_zero if bounds else 0:.1f} us after the traces' first activity)")


if __name__ == "__main__":
    main()
