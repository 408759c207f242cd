"""SVG plots of the committed benchmark results: ours vs the baselines, one panel per shape.

    python bench/tools/plot.py                       # every result folder and part under bench/results/, and their runN/
    python bench/tools/plot.py bench/results/cta_h200x2_2026-11-30/tma_store [--out-dir DIR]

Reads the JSON files the benchmarks write (``bench_collective_gemm.py``: ``<suite>_ws<N>.json``;
``bench_block.py``: ``block_ws<N>.json``; ``bench_cta.py``: ``cta_ws<N>.json``; ``bench_moe.py``:
``moe_ws<N>.json``; ``bench_epilogue.py``: ``epilogue_*_ws<N>.json``) and writes
``<same name>.svg`` next to each (or into ``--out-dir``). Each panel is one shape: horizontal bars of
the wall-clock time per call in ms (shorter is better), ours in orange, the baselines in grey/blue,
and a dashed line at the bound overlap aims for (max(mm, comm) for the collective GEMMs; one GPU's
time / 2 for CTA-pipelining). Every panel has its own scale; the numbers are printed on the bars.

The SVG is written by hand (a few lines of XML, no plotting library: the GPU image has no network
to install one), so the output is identical wherever it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from html import escape
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"

OURS, BASE, REF, IDEAL = "#e8710a", "#9aa0a6", "#1a73e8", "#188038"
WIDTH, LABEL_W, BAR_W, ROW_H, PAD = 760, 230, 430, 18, 10


# -------------------------------------------------------------------------------- the SVG writer
def svg(title: str, subtitles: list[str], panels: list[dict]) -> str:
    """``subtitles``: grey lines under the title. ``panels``: ``{"title", "bars": [(label, ms or None, kind)], "line": (label, ms) or None}``;
    ``kind`` in ``ours``, ``base``, ``ref``. A bar without a value is drawn as ``n/a``."""
    out, y = [], 28 + 16 * len(subtitles)
    for p in panels:
        bars = p["bars"]
        vals = [v for _, v, _ in bars if v is not None] + ([p["line"][1]] if p.get("line") else [])
        top = max(vals) * 1.12 if vals else 1.0
        out.append(f'<text x="{PAD}" y="{y + 14}" class="panel">{escape(p["title"])}</text>')
        y += 22
        x0 = PAD + LABEL_W
        for label, v, kind in bars:
            color = {"ours": OURS, "ref": REF}.get(kind, BASE)
            weight = ' font-weight="bold"' if kind == "ours" else ""
            out.append(f'<text x="{x0 - 6}" y="{y + 13}" text-anchor="end"{weight}>{escape(label)}</text>')
            if v is None:
                out.append(f'<text x="{x0 + 4}" y="{y + 13}" class="na">n/a</text>')
            else:
                w = max(1.0, BAR_W * v / top)
                out.append(f'<rect x="{x0}" y="{y + 2}" width="{w:.1f}" height="{ROW_H - 4}" fill="{color}"/>')
                out.append(f'<text x="{x0 + w + 4:.1f}" y="{y + 13}"{weight}>{v:.3f}</text>')
            y += ROW_H
        if p.get("line"):
            label, v = p["line"]
            lx = x0 + BAR_W * v / top
            y_top = y - ROW_H * len(bars)
            out.append(f'<line x1="{lx:.1f}" y1="{y_top}" x2="{lx:.1f}" y2="{y}" stroke="{IDEAL}" '
                       f'stroke-dasharray="4,3" stroke-width="1.5"/>')
            out.append(f'<text x="{lx + 3:.1f}" y="{y + 11}" class="ideal">{escape(label)} = {v:.3f}</text>')
            y += 14
        y += PAD
    height = y + PAD
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" '
        f'font-family="Helvetica, Arial, sans-serif" font-size="11">\n'
        f'<style>.title{{font-size:14px;font-weight:bold}} .sub{{fill:#5f6368}} .panel{{font-weight:bold}} '
        f'.na{{fill:#9aa0a6;font-style:italic}} .ideal{{fill:{IDEAL};font-size:10px}}</style>\n'
        f'<rect width="100%" height="100%" fill="white"/>\n'
        f'<text x="{PAD}" y="18" class="title">{escape(title)}</text>\n'
        + "".join(f'<text x="{PAD}" y="{34 + 16 * i}" class="sub">{escape(s)}</text>\n'
                  for i, s in enumerate(subtitles))
    )
    return head + "\n".join(out) + "\n</svg>\n"


# ----------------------------------------------------------------------------------- the formats
def _machine(info: dict) -> str:
    return (f"{info.get('world_size', '?')}x {info.get('gpu', '?')}, torch {info.get('torch', '?')}, "
            f"Triton {info.get('triton', '?')}, NCCL {info.get('nccl', '?')}, {info.get('date', '')[:10]}; "
            "ms per call (median, slowest rank), lower is better")


def collective(data: dict) -> tuple[str, str, list[dict]]:
    """``bench_collective_gemm.py``: columns mm, comm, seq, torch..., ours / ours_p2p / ours_symm."""
    cols = data["columns"]
    panels = []
    for row in data["rows"]:
        t = row.get("times_ms", {})
        bars = []
        for key, label in cols.items():
            if key in ("mm", "comm"):
                continue  # they make the bound line
            kind = "ours" if key.startswith("ours") else ("ref" if key == "seq" else "base")
            bars.append((label, t.get(key), kind))
        bars = [(cols["mm"], t.get("mm"), "base"), (cols["comm"], t.get("comm"), "base")] + bars
        bound = row.get("max_mm_comm_ms") or max((t.get("mm") or 0), (t.get("comm") or 0)) or None
        panels.append({"title": f"M={row['M']} K={row['K']} N={row['N']}", "bars": bars,
                       "line": ("max(mm, comm)", bound) if bound else None})
    title = f"{data['suite']}, ws={data['world_size']}"
    return title, [data.get("description", ""), _machine(data.get("machine", {}))], panels


def block(data: dict) -> tuple[str, str, list[dict]]:
    """``bench_block.py``: one step of the TP+SP block, forward + backward, per compiler variant."""
    bars = [(v["label"], v.get("time_ms"), "ours" if v["variant"].startswith("overlap") else "base")
            for v in data["variants"]]
    s = data.get("sizes", {})
    sizes = ", ".join(f"{k} {v}" for k, v in s.items())
    title = f"TP+SP transformer block, forward + backward, ws={data['world_size']}"
    return title, [sizes, _machine(data.get("machine", {}))], [{"title": "one training step", "bars": bars}]


def cta(data: dict) -> tuple[str, str, list[dict]]:
    """``bench_cta.py``: the TP MLP per activation and M; ours is ``CTA 2`` (eager and graph)."""
    info = data["info"]
    panels = []
    for row in data["rows"]:
        one = row.get("1 GPU")
        mb_k, kc = row.get("µbatch k"), row.get("CTA 2 kc")
        bars = [
            ("1 GPU (whole MLP)", one, "base"),
            ("TP2 (shards + NCCL all-reduce)", row.get("TP2"), "ref"),
            (f"micro-batch pipeline (k={mb_k})", row.get("µbatch"), "base"),
            (f"CTA 2, ours ({kc})", row.get("CTA 2"), "ours"),
            ("TP2, CUDA graph", row.get("TP2 (graph)"), "ref"),
            ("CTA 2, ours, CUDA graph", row.get("CTA 2 (graph)"), "ours"),
        ]
        panels.append({"title": f"{row['act']}, M={row['M']}", "bars": bars,
                       "line": ("1 GPU / 2", one / 2) if one else None})
    title = (f"CTA-pipelined TP MLP, ws={info.get('world_size', '?')} "
             f"(H={info.get('hidden', '?')}, F={info.get('ffn', '?')})")
    return title, [_machine(info)], panels


def moe(data: dict) -> tuple[str, str, list[dict]]:
    """``bench_moe.py``: per config and routing, the baseline, its parts, ours (default transport), the
    sweep's variants (comm SMs, transports, tile orders) and, with ``--graphs``, both replayed."""
    info = data["info"]
    panels = []
    for r in data["results"]:
        t = r.get("times_ms", {})
        if not t:
            continue
        bars = [("NCCL a2a + grouped_mm (baseline)", t.get("baseline"), "ref"),
                ("the two all-to-alls alone", t.get("a2a"), "base"),
                ("the experts alone", t.get("experts"), "base"),
                ("p2p, ours", t.get("p2p"), "ours"),
                ("symm, ours (default)", t.get("symm"), "ours")]
        for name, v in r.get("sweep", {}).items():
            label = f"symm, SM combine, {name} SMs" if name.isdigit() else f"symm, {name}"
            bars.append((label, v.get("ms"), "ours"))
        g = r.get("graphs", {})  # bench_moe --graphs: both captured in a CUDA graph, replays
        bars += [("baseline, CUDA graph replay", g.get("baseline"), "ref"),
                 ("symm, ours, CUDA graph replay", g.get("symm"), "ours")]
        panels.append({"title": f"{r['config']}, {r['routing']}", "bars": [b for b in bars if b[1] is not None],
                       "line": ("max(experts, a2a)", t.get("max")) if t.get("max") else None})
    return f"MoE layer, ws={info.get('world_size', '?')}", [_machine(info)], panels


def epilogue(data: dict) -> tuple[str, str, list[dict]]:
    """``bench_epilogue.py``: one step of the block per variant (fused epilogues vs unfused vs Inductor)."""
    info, args = data["info"], data.get("args", {})
    bars = [(f"{v['variant']} ({v.get('kernels_per_step', 0):.0f} kernels)", v.get("time_ms"),
             "ref" if v["variant"] == "inductor" else "ours") for v in data["rows"]]
    title = f"fused epilogues: {args.get('block', '?')} block, {args.get('mode', '?')}, ws={info.get('world_size', '?')}"
    return title, [_machine(info)], [{"title": "one step", "bars": bars}]


def plot_file(path: Path, out_dir: Path | None = None) -> Path | None:
    """Write the SVG of one result JSON; None for a file of no known format."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict):  # e.g. a probe's list of measurements: no plot
        return None
    if "suite" in data and "rows" in data:
        title, sub, panels = collective(data)
    elif data.get("benchmark") == "block":
        title, sub, panels = block(data)
    elif "info" in data and data.get("rows") and "CTA 2" in data["rows"][0]:
        title, sub, panels = cta(data)
    elif "info" in data and data.get("results") and "sweep" in data["results"][0]:
        title, sub, panels = moe(data)
    elif "info" in data and data.get("rows") and "kernels_per_step" in data["rows"][0]:
        title, sub, panels = epilogue(data)
    else:
        return None
    dest = (out_dir or path.parent) / (path.stem + ".svg")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(svg(title, sub, panels))
    return dest


def run_roots() -> list[Path]:
    """Every result folder under bench/results, and every part of one (a subfolder with its own README.md)."""
    roots = []
    for d in sorted(p for p in RESULTS.iterdir() if p.is_dir()):
        roots.append(d)
        roots += sorted(p for p in d.iterdir() if p.is_dir() and (p / "README.md").exists())
    return roots


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="*", type=Path, help="result directories (default: every one under bench/results)")
    ap.add_argument("--out-dir", type=Path, help="write the SVGs here instead of next to the JSON files")
    opts = ap.parse_args(argv)
    dirs = opts.dirs or run_roots()
    written = []
    for d in dirs:
        for f in sorted(d.glob("*.json")) + sorted(d.glob("run*/*.json")):  # each device call's runN/ too
            sub = d.resolve().relative_to(RESULTS) if d.resolve().is_relative_to(RESULTS) else d.name
            dest = plot_file(f, opts.out_dir / sub if opts.out_dir else None)
            if dest is not None:
                written.append(dest)
                print(dest)
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
