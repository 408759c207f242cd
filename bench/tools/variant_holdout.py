"""The tuned variants checked on a run that did not pick them: per ``ag_mm`` / ``mm_rs`` / ``mm_ar`` case of a
kernel benchmark run, the variant that a ratio file installed *before* that run makes the op tune over
(``spec.kernel_ratios.measured_variant``), and the op's time in this run with and without it (the op keeps the
faster: it tunes over both). A variant picked as the fastest of many noisy timings looks better in the run that
picked it than it is; here it is timed again.

    git show REV:overlap_backend/spec/kernel_ratios.json > /tmp/before.json
    python bench/tools/variant_holdout.py RUN --ratios /tmp/before.json --label REV:... [--out FILE.md]

``RUN``: a ``bench/suites/bench_kernels.py`` output folder; ``--ratios``: the ratio file as installed before it
(``--label``: how the output names it, e.g. its git revision and path).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.tools import common  # noqa: E402

BAR = 1.03
KERNELS = ("ag_mm", "mm_rs", "mm_ar")


def holdout(rows: list[dict], ratio_file: Path, gpu: str) -> list[dict]:
    """Per case of ``KERNELS``: the op's ratio on its candidates (``without``), the variant ``ratio_file``
    adopts there (None: none) and the op's ratio with it among its candidates (``with``)."""
    from overlap_backend.spec import kernel_ratios

    out = []
    with kernel_ratios.reading(ratio_file):
        for r in rows:
            c = r["case"]
            if c["kernel"] not in KERNELS or "op_ratio" not in r:
                continue
            variant = kernel_ratios.measured_variant(c["kernel"], c["M"], c["K"], c["N"], ws=c["ws"], gpu=gpu,
                                                     fused=bool(c["epilogue"]))
            times = {tuple(x["config"]): x["ms"] for x in r["configs"] if "ms" in x and x.get("config")}
            timed = variant is not None and tuple(variant) in times
            ms = min(r["op_ms"], times[tuple(variant)]) if timed else r["op_ms"]
            out.append({"case": c, "variant": variant, "timed": timed, "without": r["op_ratio"],
                        "with": r["op_ratio"] * ms / r["op_ms"]})
    return out


def markdown(entries: list[dict], source: str, ratio_file: str) -> str:
    head = ["kernel", "cases", "variant adopted", f"≤ {BAR} without", f"≤ {BAR} with", "geo-mean without",
            "geo-mean with"]
    body = []
    for k in KERNELS:
        es = [e for e in entries if e["case"]["kernel"] == k]
        if es:
            body.append([k, len(es), sum(e["variant"] is not None for e in es), sum(e["without"] <= BAR for e in es),
                         sum(e["with"] <= BAR for e in es), f"{statistics.geometric_mean([e['without'] for e in es]):.3f}",
                         f"{statistics.geometric_mean([e['with'] for e in es]):.3f}"])
    rows = [[e["case"]["kernel"], e["case"]["ws"], f"{e['case']['M']}×{e['case']['K']}×{e['case']['N']}",
             e["case"]["epilogue"] or "-", "x".join(map(str, e["variant"][:3])) + f" g{e['variant'][3]} s{e['variant'][4]} w{e['variant'][5]} "
             + {False: "pointer stores", True: "tma"}.get(e["variant"][6], str(e["variant"][6]))
             + ("" if e["timed"] else " (not timed in this run)"), f"{e['without']:.3f}", f"{e['with']:.3f}"]
            for e in entries if e["variant"] is not None]
    return "\n".join([
        "# Tuned variants on a run that did not pick them", "",
        f"Run `{source}`; variants adopted by `{ratio_file}` (installed before the run). Ratios: the op's kernel "
        "time over cuBLAS's on the same GEMM (fused: over cuBLAS plus the separate epilogue), on its tuning "
        "candidates alone (`without`) and with the adopted variant among them (`with`: the faster of the two).", "",
        common.markdown_table(head, body), "", "## Cases with a variant adopted", "",
        common.markdown_table(["kernel", "ws", "local M×K×N", "fused epilogue", "variant", "without", "with"], rows),
        ""])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run", type=Path, help="a bench_kernels.py output folder")
    p.add_argument("--ratios", type=Path, required=True, help="the ratio file as installed before that run")
    p.add_argument("--label", help="the ratio file's name in the output (default: its path)")
    p.add_argument("--out", type=Path, help="write the markdown here (default: print it)")
    args = p.parse_args(argv)
    results = json.loads((args.run / "results.json").read_text())
    entries = holdout(results["rows"], args.ratios, results["info"].get("gpu", "?"))
    text = markdown(entries, str(args.run), args.label or str(args.ratios))
    if args.out:
        args.out.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
