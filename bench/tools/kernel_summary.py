"""The README's kernel table from kernel benchmark runs: per kernel (plain and fused apart), per run, how many
shapes the op's kernel is within 1.03x of its baseline, the median and worst ratio, and on the path the op
takes at each shape (``bench/suites/kernel_paths.py``) how many are within 1.03x and their geo-mean.

    python bench/tools/kernel_summary.py LABEL=DIR [LABEL=DIR...]      # e.g. H100=bench/results/kernels_h100x1_...
    python bench/tools/kernel_summary.py H100=DIR --over H100=EARLIER,EARLIER   # one GPU's runs together

Prints a markdown table (one column group per run, in the order given) to paste into the README.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.suites import kernel_paths  # noqa: E402
from bench.tools import common  # noqa: E402

BAR = kernel_paths.BAR


def groups(rows: list[dict]) -> dict[str, list[dict]]:
    """The kernels' rows with a measured op ratio, keyed ``kernel`` or ``kernel (fused)``, in the run's order."""
    out: dict[str, list[dict]] = {}
    for r in rows:
        if "op_ratio" in r:
            c = r["case"]
            out.setdefault(c["kernel"] + (" (fused)" if c["epilogue"] and c["kernel"] in ("ag_mm", "mm_rs") else ""),
                           []).append(r)
    return out


def summarize(folder: Path, over: list[Path] = ()) -> dict[str, dict]:
    """Per group: shapes, within the bar, median, worst; and on the op's path: within, not measured, geo-mean. With
    ``over``, the run read over those earlier runs of its GPU (``kernel_paths.read_runs``)."""
    all_rows, entries, _ = kernel_paths.read_runs(folder, over)
    on_path = {kernel_paths.case_key(e["case"]): e["path_ratio"] for e in entries}
    out = {}
    for name, rows in groups(all_rows).items():
        ratios = [r["op_ratio"] for r in rows]
        path = [on_path.get(kernel_paths.case_key(r["case"]), "-") for r in rows]
        measured = [p for p in path if isinstance(p, float)]
        out[name] = {"shapes": len(rows), "within": sum(x <= BAR for x in ratios), "median": statistics.median(ratios),
                     "worst": max(ratios), "path_within": sum(p <= BAR for p in measured) if measured else None,
                     "path_unmeasured": sum(p is None for p in path),
                     "path_geo": statistics.geometric_mean(measured) if measured else None,
                     "has_path": any(p != "-" for p in path)}
    return out


def table(runs: list[tuple[str, dict[str, dict]]]) -> str:
    head = ["kernel"]
    for label, _ in runs:
        head += [f"{label}: ≤ {BAR}× / shapes", f"{label}: median, worst",
                 f"{label}: op's path ≤ {BAR}× (geo-mean)"]
    names = []
    for _, summary in runs:
        names += [n for n in summary if n not in names]
    body = []
    for name in names:
        cells = [f"`{name}`"]
        for _, summary in runs:
            s = summary.get(name)
            if s is None:
                cells += ["-", "-", "-"]
                continue
            cells += [f"{s['within']} / {s['shapes']}", f"{s['median']:.2f}×, {s['worst']:.2f}×", _path_cell(s)]
        body.append(cells)
    return common.markdown_table(head, body)


def _path_cell(s: dict) -> str:
    if not s["has_path"]:
        return "-"
    if s["path_geo"] is None:
        return f"not measured ({s['path_unmeasured']})"
    text = f"{s['path_within']} ({s['path_geo']:.2f}×)"
    return text + (f", {s['path_unmeasured']} not measured" if s["path_unmeasured"] else "")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", metavar="LABEL=DIR", help="a label and a bench_kernels.py output folder")
    p.add_argument("--over", action="append", default=[], metavar="LABEL=DIR,DIR",
                   help="earlier runs of that label's GPU (oldest first) its run is read over")
    args = p.parse_args(argv)
    over = {}
    for item in args.over:
        label, sep, folders = item.partition("=")
        if not sep:
            p.error(f"--over {item!r}: expected LABEL=DIR,DIR")
        over[label] = [Path(f) for f in folders.split(",") if f]
    runs = []
    for item in args.runs:
        label, sep, folder = item.partition("=")
        if not sep or not (Path(folder) / "results.json").exists():
            p.error(f"{item!r}: expected LABEL=DIR with DIR/results.json")
        runs.append((label, summarize(Path(folder), over.get(label, []))))
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
