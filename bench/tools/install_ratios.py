"""Install kernel benchmark runs' ratios into the package's ``overlap_backend/spec/kernel_ratios.json``.

    python bench/tools/install_ratios.py DIR [DIR...] [--kernels k1,k2] [--rows LO-HI] [--target FILE] [--dry-run]

Each ``DIR`` is a ``bench/suites/bench_kernels.py`` output folder. For every (GPU, kernel, world size) a run
measured (only ``--kernels`` where given), its entries replace the target's entries of that GPU, kernel and world
size (a run with ``--ws 8`` replaces the 8-GPU shapes only); a later ``DIR`` wins over an earlier one; every other
entry stays. ``--rows LO-HI`` installs only the runs' entries of LO to HI local rows (M), each replacing the target's
entry of the same shape alone (a sweep of decode sizes, ``bench_kernels.py --max-rows``, beside the record's other
shapes). An installed entry's ``source`` is its folder (relative to the repository). The file's ``about`` is
written from the entries' sources, per GPU. Prints what it replaced.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from overlap_backend.spec import kernel_ratios  # noqa: E402


def merge(installed: list[dict], runs: list[list[dict]], kernels: set[str] | None = None,
          rows: tuple[int, int] | None = None) -> tuple[list[dict], list[str]]:
    """(the merged entries, a line per group replaced): each run's (gpu, kernel, ws) groups replace those of
    ``installed`` and of earlier runs, or with ``rows`` (LO, HI) its entries of LO to HI rows replace those of the same
    shape alone; the order of ``installed`` is kept, new groups appended."""
    def key(e):
        group = e["gpu"], e["kernel"], int(e["ws"])
        if rows is None:
            return group
        return (*group, int(e["M"]), int(e["K"]), int(e["N"]), e.get("dtype"), bool(e.get("fused")),
                e.get("epilogue", ""), e.get("moe", ""))

    if rows is not None:
        runs = [[e for e in run if rows[0] <= int(e["M"]) <= rows[1]] for run in runs]

    groups: dict[tuple, list[dict]] = {}
    for e in installed:
        groups.setdefault(key(e), []).append(e)
    report = []
    for run in runs:
        new: dict[tuple, list[dict]] = {}
        for e in run:
            if kernels is None or e["kernel"] in kernels:
                new.setdefault(key(e), []).append(e)
        for k, entries in new.items():
            shape = f" {k[3]}x{k[4]}x{k[5]}" if rows is not None else ""
            report.append(f"{k[0]} {k[1]} ws {k[2]}{shape}: {len(groups.get(k, []))} -> {len(entries)} entries "
                          f"({entries[0].get('source', '?')})")
            groups[k] = entries
    return [e for entries in groups.values() for e in entries], report


def about(entries: list[dict]) -> str:
    """The file's description: per GPU, the sources of its entries and their kernels."""
    per_gpu: dict[str, dict[str, list[str]]] = {}
    for e in entries:
        kernels = per_gpu.setdefault(e["gpu"], {}).setdefault(str(e.get("source", "?")), [])
        if e["kernel"] not in kernels:
            kernels.append(e["kernel"])
    parts = [f"{gpu}: " + "; ".join(f"{', '.join(ks)} from {src}" for src, ks in sources.items())
             for gpu, sources in per_gpu.items()]
    return ("Kernel / cuBLAS ratios of the op kernels and the ops' cuBLAS paths on the same local GEMMs, measured by "
            "bench/suites/bench_kernels.py on one GPU (installed by bench/tools/install_ratios.py). " + " | ".join(parts))


def _source(folder: Path) -> str:
    """``folder`` relative to the repository where it lies inside it (the results folder of record)."""
    repo = Path(__file__).resolve().parents[2]
    try:
        return str(folder.resolve().relative_to(repo))
    except ValueError:
        return str(folder)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dirs", nargs="+", type=Path, help="bench_kernels.py output folders (kernel_ratios.json inside)")
    p.add_argument("--kernels", default="", help="comma-separated kernels to install (default: every one measured)")
    p.add_argument("--rows", default="", help="LO-HI: only the entries of LO to HI local rows, each replacing its "
                                              "shape's entry alone")
    p.add_argument("--target", type=Path, default=kernel_ratios.PACKAGED)
    p.add_argument("--dry-run", action="store_true", help="report, write nothing")
    args = p.parse_args(argv)
    runs = []
    for d in args.dirs:
        doc = json.loads((d / "kernel_ratios.json").read_text())
        if doc.get("format") != kernel_ratios.FORMAT:
            p.error(f"{d}/kernel_ratios.json: format {doc.get('format')!r}, expected {kernel_ratios.FORMAT}")
        source = _source(d)  # (the run wrote the device's own output path)
        runs.append([{**e, "source": source} for e in doc["entries"]])
    installed = kernel_ratios.entries(args.target) if args.target.exists() else []
    rows = None
    if args.rows:
        lo, sep, hi = args.rows.partition("-")
        if not (sep and lo.isdigit() and hi.isdigit() and int(lo) <= int(hi)):
            p.error(f"--rows {args.rows!r}: expected LO-HI, e.g. 65-128")
        rows = int(lo), int(hi)
    merged, report = merge(installed, runs, set(args.kernels.split(",")) - {""} or None, rows)
    print("\n".join(report) or "nothing to install")
    if not args.dry_run:
        args.target.write_text(json.dumps(kernel_ratios.document(merged, about(merged)), indent=1) + "\n")
        print(f"wrote {args.target}: {len(merged)} entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
