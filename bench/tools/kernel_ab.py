"""Two kernel benchmark runs side by side (the code before and after a change, on one machine): per shape the
baseline of each run, the op's time and ratio to its own run's baseline in each, the op's config after, and the
op's ratio after over before: its time after over before at the same clock, as each run's ratio is to the cuBLAS
calls beside it (the op's times of two runs, made minutes apart, differ by the GPU's clock too).

    python bench/tools/kernel_ab.py BEFORE_DIR AFTER_DIR [--out FILE]      # each holding results.json

Prints a markdown table (shapes of both runs, in the after run's order) and the geo-means of the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.suites import kernel_paths  # noqa: E402
from bench.suites.bench_kernels import config_label  # noqa: E402


def measured(run_dir: Path) -> dict[str, dict]:
    """The run's rows with a measured op time, by label."""
    rows = json.loads((run_dir / "results.json").read_text())["rows"]
    return {r["label"]: r for r in rows if r.get("op_ms") and r.get("baseline_ms")}


def table(before: dict[str, dict], after: dict[str, dict]) -> str:
    both = [label for label in after if label in before]
    if not both:
        raise SystemExit("no shape measured in both runs")
    lines = ["| shape | baseline ms before / after | op ms before | op / baseline before | op ms after "
             "| op / baseline after | op's config after | op / baseline, after over before |",
             "|---|---|---|---|---|---|---|---|"]
    ratios = {"before": [], "after": [], "change": []}
    for label in both:
        b, a = before[label], after[label]
        ratios["before"].append(b["op_ratio"])
        ratios["after"].append(a["op_ratio"])
        ratios["change"].append(a["op_ratio"] / b["op_ratio"])
        lines.append(f"| {label} | {b['baseline_ms']:.3f} / {a['baseline_ms']:.3f} | {b['op_ms']:.3f} | "
                     f"{kernel_paths.fmt_ratio(b['op_ratio'])} | {a['op_ms']:.3f} | "
                     f"{kernel_paths.fmt_ratio(a['op_ratio'])} | {config_label(a['op_config'])} | "
                     f"{ratios['change'][-1]:.3f} |")
    geo = {k: statistics.geometric_mean(v) for k, v in ratios.items()}
    over = {k: sum(r > kernel_paths.BAR for r in ratios[k]) for k in ("before", "after")}
    lines.append(f"\n{len(both)} shapes. Op / baseline, geo-mean: before {geo['before']:.3f} ({over['before']} over "
                 f"{kernel_paths.BAR}), after {geo['after']:.3f} ({over['after']} over); op / baseline after over "
                 f"before, geo-mean {geo['change']:.3f}.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--out", type=Path, help="also write the table here")
    args = p.parse_args(argv)
    text = table(measured(args.before), measured(args.after))
    print(text, end="")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
