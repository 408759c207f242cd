"""The path each op takes at each shape of a kernel benchmark run, and that path's ratio to cuBLAS.

The ops choose per shape between their Triton kernel and a cuBLAS path (or ``torch.sum`` for the one-shot
all-reduce, ``torch._grouped_mm`` for the MoE experts) from the measured ratios (``spec/kernel_ratios.py``). This
module asks the runtime's own choice functions what they decide on a run's ratios and GPU, and reads the chosen
path's ratio from the same run: the op's GEMM time over cuBLAS's on the same local GEMM, the kernel benchmark's bar.

    python bench/suites/kernel_paths.py DIR [DIR...]     # writes DIR/paths.md for each run folder
    python bench/suites/kernel_paths.py DIR --over EARLIER [EARLIER...]   # one GPU's runs together

``--over``: a run that measured some kernels only (e.g. the cuBLAS paths) is read over earlier runs of the same
GPU: their rows and ratios, with this run's where it measured a case again (later runs win, as in
``bench/tools/install_ratios.py``).

Paths are given twice: with the knobs as set (the CTA stages and the MoE experts stay on their kernels unless
``knobs.cta.STAGE*_GEMM`` / ``knobs.moe.EXPERT_GEMM`` say otherwise) and with those set to ``"auto"``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.tools import common  # noqa: E402

BAR = 1.03
# kernel -> the row that measures the op's other path at the same case (None: that path is the baseline itself)
OTHER_PATH = {"ag_mm": "ag_mm_cublas", "mm_rs": "mm_rs_cublas", "mm_ar": "mm_ar_cublas", "oneshot": None,
              "cta_stage0": "cta_stage0_cublas", "cta_stage1": "cta_stage1_cublas",
              "moe_gate_up": "moe_grouped_mm", "moe_down": "moe_grouped_mm"}


def choose(case: dict, gpu: str) -> str:
    """``"kernel"``, ``"other"`` or ``"apart"`` (``ag_mm``'s kernel with its epilogue run after it): what the runtime
    decides for this case (rank 0 of ``case['ws']``, one run per chunk, bf16) with the ratio file and knobs in
    effect."""
    from overlap_backend.runtime import cta_cublas, moe_grouped
    from overlap_backend.runtime.symm import ag_mm, mm_ar, mm_rs

    k, ws, M, K, N = case["kernel"], case["ws"], case["M"], case["K"], case["N"]
    kw = {"dtype": "bfloat16", "gpu": gpu}
    if k == "ag_mm":
        if ag_mm.ag_gemm(1, M // ws, K, N, bool(case["epilogue"]), ws=ws, **kw) == "cublas":
            return "other"
        return "apart" if case["epilogue"] and ag_mm.ag_epilogue_apart(1, M // ws, K, N, ws=ws, **kw) else "kernel"
    if k == "mm_rs":
        return "other" if mm_rs.rs_gemm(1, M // ws, K, N=N, ws=ws, **kw) == "cublas" else "kernel"
    if k == "mm_ar":
        return "other" if mm_ar.ar_gemm(M, K, ws, N=N, **kw) == "cublas" else "kernel"
    if k == "oneshot":
        return "other" if mm_ar.oneshot_sum(M, N, ws, **kw) == "torch" else "kernel"
    if k in ("cta_stage0", "cta_stage1"):
        return "other" if cta_cublas.stage_form(int(k[-1]), M, K, N, ws, **kw) == "cublas" else "kernel"
    if k in ("moe_gate_up", "moe_down"):
        from overlap_backend.spec import knobs

        if knobs.moe.EXPERT_GEMM == "triton":
            return "kernel"
        if knobs.moe.EXPERT_GEMM == "grouped_mm":
            return "other"
        h, f = (K, N) if k == "moe_gate_up" else (N, K)
        return "other" if moe_grouped.grouped_wins(M, h, f, ws, **kw)[0] else "kernel"
    raise ValueError(f"no op path for kernel {k!r}")


def case_key(case: dict, kernel: str | None = None) -> tuple:
    """A row's key (``kernel``: the same case's row of another kernel); the MoE form's row for ``moe_down`` is the
    layer's, keyed by gate/up's [M, H] @ [H, F] and epilogue."""
    if case["kernel"] == "moe_down" and kernel == "moe_grouped_mm":
        return (kernel, case["ws"], case["M"], case["N"], case["K"], "swiglu", case["moe"])
    return (kernel or case["kernel"], case["ws"], case["M"], case["K"], case["N"], case["epilogue"], case["moe"])


def _other(table: dict, case: dict, kernel: str):
    """``kernel``'s row for ``case`` in ``table``; a fused case without one reads the plain row (ag_mm's cuBLAS
    path runs the epilogue apart, which adds the same time to it and to the baseline: a bound)."""
    got = table.get(case_key(case, kernel))
    return got if got is not None else table.get(case_key({**case, "epilogue": ""}, kernel))


def paths(rows: list[dict], ratio_file: Path, gpu: str) -> list[dict]:
    """Per kernel row of a run: the kernel's and the other path's ratios, and the path chosen with the knobs as set
    (``path``) and with the CTA / MoE forms on ``"auto"`` (``auto``), each with its ratio (None: not measured)."""
    from overlap_backend.spec import kernel_ratios, knobs

    ratio = {case_key(r["case"]): r["op_ratio"] * _variant_scale(r) for r in rows if "op_ratio" in r}
    with_sum = {case_key(r["case"]): r["op_ratio_with_sum"] * _variant_scale(r) for r in rows
                if "op_ratio_with_sum" in r}
    apart = {case_key(r["case"]): r["apart_ratio"] for r in rows if "apart_ratio" in r}
    out = []
    with kernel_ratios.reading(ratio_file):
        for r in rows:
            c = r["case"]
            if c["kernel"] not in OTHER_PATH or "op_ratio" not in r:
                continue
            other = OTHER_PATH[c["kernel"]]
            other_ratio = 1.0 if other is None else _other(ratio, c, other)
            kernel_ratio = ratio[case_key(c)]
            entry = {"case": c, "kernel_ratio": kernel_ratio, "other": other or "torch.sum",
                     "other_ratio": other_ratio}
            entry["path"] = choose(c, gpu)
            with knobs.cta.patch(STAGE0_GEMM="auto", STAGE1_GEMM="auto"), knobs.moe.patch(EXPERT_GEMM="auto"):
                entry["auto"] = choose(c, gpu)
            for name in ("path", "auto"):
                entry[name + "_ratio"] = {"kernel": kernel_ratio, "other": other_ratio,
                                          "apart": apart.get(case_key(c))}[entry[name]]
            if c["kernel"] in ("mm_rs", "mm_ar"):  # over the baseline and the sum the unfused collective does
                entry["path_ratio_with_sum"] = (with_sum.get(case_key(c)) if entry["path"] == "kernel"
                                                else _other(with_sum, c, other))
            out.append(entry)
    return out


def measured_variants(row: dict, n: int = 4) -> list[list]:
    """The ``n`` fastest bench-only variants of a benchmark row, ``[config, ratio]`` each, fastest first: the ratio
    file's ``variants``, which the ops fall back on where they may not take the fastest."""
    timed = sorted((c for c in row.get("configs", ()) if c.get("kind") == "variant" and c.get("ratio") is not None),
                   key=lambda c: c["ratio"])
    return [[c["config"], round(c["ratio"], 4)] for c in timed[:n]]


def _variant_scale(row: dict) -> float:
    """The op's kernel time at this row's case over its tuning candidates' best: 1, or where the op tunes over one
    of the run's bench-only variants too (``kernel_ratios.adopted_variant``: ag_mm, mm_rs and mm_ar, where that
    variant won by enough and may be taken) the variant's time over theirs."""
    from overlap_backend.spec import kernel_ratios

    entry = {"kernel": row["case"]["kernel"], "ratio": row["op_ratio"], "best_variant_ratio": None,
             "best_config": None, "variants": measured_variants(row), "fused": bool(row["case"]["epilogue"])}
    adopted = kernel_ratios.adopted_variant(entry)
    return adopted[1] / row["op_ratio"] if adopted else 1.0


def fmt_ratio(v) -> str:
    return "n/a" if v is None else f"{v:.3f}" + (" **>1.03**" if v > BAR else "")


def _name(entry: dict, which: str) -> str:
    if entry[which] == "apart":
        return entry["case"]["kernel"] + ", epilogue apart"
    return entry["case"]["kernel"] if entry[which] == "kernel" else entry["other"]


def summary(entries: list[dict], which: str = "path_ratio") -> list[list]:
    """Per kernel (that has ``which``): cases, cases whose chosen path measured ≤ BAR, cases whose path was not
    measured, geo-mean, range."""
    by: dict[str, list] = {}
    for e in entries:
        if which in e:
            by.setdefault(e["case"]["kernel"], []).append(e[which])
    body = []
    for k, v in by.items():
        got = [x for x in v if x is not None]
        gm = statistics.geometric_mean(got) if got else None
        body.append([k, len(v), sum(x <= BAR for x in got), len(v) - len(got), fmt_ratio(gm),
                     f"{min(got):.2f}–{max(got):.2f}" if got else "n/a"])
    return body


def markdown(entries: list[dict], gpu: str, source: str) -> str:
    """paths.md; the "auto" columns and summary only where the forms' knobs as set chose otherwise somewhere."""
    with_auto = any(e["auto"] != e["path"] for e in entries)
    head = ["kernel", "ws", "local M×K×N", "fused epilogue", "kernel / cuBLAS", "other path", "other / cuBLAS",
            "op's path", "op / cuBLAS", "op / (cuBLAS + sum)"] + (["with auto forms", "auto / cuBLAS"] if with_auto else [])
    body = [[e["case"]["kernel"], e["case"]["ws"],
             f"{e['case']['M']}×{e['case']['K']}×{e['case']['N']}" + (f" ({e['case']['moe']})" if e["case"]["moe"] else ""),
             e["case"]["epilogue"] or "-", fmt_ratio(e["kernel_ratio"]), e["other"], fmt_ratio(e["other_ratio"]),
             _name(e, "path"), fmt_ratio(e["path_ratio"]),
             fmt_ratio(e["path_ratio_with_sum"]) if "path_ratio_with_sum" in e else "-"]
            + ([_name(e, "auto"), fmt_ratio(e["auto_ratio"])] if with_auto else []) for e in entries]
    sum_head = ["kernel", "cases", f"≤ {BAR} on the op's path", "path not measured", "geo-mean", "range"]
    auto_note = ("`with auto forms`: the CTA stages and MoE experts with `knobs.cta.STAGE*_GEMM` / "
                 "`knobs.moe.EXPERT_GEMM` = \"auto\". " if with_auto else "")
    auto_section = (["## Per kernel, with the CTA and MoE forms on auto", "",
                     common.markdown_table(sum_head, summary(entries, "auto_ratio")), ""] if with_auto else [])
    return "\n".join([
        f"# The op's path at each shape, {gpu}", "",
        f"From `{source}`: at each shape, the path the runtime's own choice functions take on these ratios "
        "(`kernel_ratios.measured_choice` and the CTA / MoE form choices) and that path's ratio to the baseline "
        "(cuBLAS on the same local GEMM; fused epilogues: cuBLAS plus the separate pointwise op; the one-shot sum: "
        "`torch.sum`; MoE: `torch._grouped_mm`). `kernel / cuBLAS`: the op's kernel, the best of its tuning "
        "candidates, or for `ag_mm`, `mm_rs` and `mm_ar` the run's best bench-only variant where that won by "
        "`knobs.codegen.MEASURED_VARIANT_GAIN` (the op then tunes over it too). `other path`: the op's cuBLAS path (`*_cublas` rows: its GEMMs "
        "per chunk or band with the flags, over one GEMM), `torch.sum`, or the MoE experts' grouped-GEMM form "
        "(over both grouped GEMMs); a fused case's cuBLAS path reads the plain one's ratio (its epilogue runs "
        f"apart, as the baseline's does: a bound); `epilogue apart`: `ag_mm`'s kernel run plain, its epilogue after it, "
        f"where that measured faster than fused (`apart_ratio`). n/a: that path was not measured. {auto_note}Bar: ≤ {BAR}. "
        "`op / (cuBLAS + sum)` (`mm_rs`, `mm_ar`): over cuBLAS followed by `torch.sum` of this rank's ws partials, "
        "the sum the unfused reduce-scatter or all-reduce does and these ops do in their GEMM's epilogue.",
        "", "## Per kernel, the op's path with the knobs as set", "", common.markdown_table(sum_head, summary(entries)),
        "", *auto_section,
        "## `mm_rs` and `mm_ar` against cuBLAS plus the collective's sum", "",
        common.markdown_table(sum_head, summary(entries, "path_ratio_with_sum")), "", "## Every shape", "",
        common.markdown_table(head, body), ""])


def read_runs(folder: Path, over: list[Path] = ()) -> tuple[list[dict], list[dict], str]:
    """(rows, path entries (:func:`paths`), GPU) of the run in ``folder`` read over the ``over`` folders (earlier
    runs of the same GPU, oldest first; a case in several: the latest run's rows and ratios)."""
    from bench.tools import install_ratios

    runs = [*over, folder]
    docs = [json.loads((f / "results.json").read_text()) for f in runs]
    gpu = docs[-1]["info"].get("gpu", "?")
    others = {str(f): d["info"].get("gpu") for f, d in zip(runs, docs) if d["info"].get("gpu") != gpu}
    if others:
        raise SystemExit(f"{folder} measured {gpu}, but {others}: --over takes runs of one GPU")
    rows: dict[tuple, dict] = {}
    for d in docs:
        rows.update((case_key(r["case"]), r) for r in d["rows"])
    ratio_docs = [json.loads((f / "kernel_ratios.json").read_text()) for f in runs if (f / "kernel_ratios.json").exists()]
    if not ratio_docs:
        return list(rows.values()), [], gpu
    entries, _ = install_ratios.merge(ratio_docs[0]["entries"], [d["entries"] for d in ratio_docs[1:]])
    with tempfile.TemporaryDirectory() as tmp:
        ratio_file = Path(tmp) / "kernel_ratios.json"
        ratio_file.write_text(json.dumps({**ratio_docs[-1], "entries": entries}))
        return list(rows.values()), paths(list(rows.values()), ratio_file, gpu), gpu


def write(folder: Path, over: list[Path] = ()) -> Path:
    """``folder/paths.md`` from its ``results.json`` and ``kernel_ratios.json``, read over those of the ``over``
    folders (:func:`read_runs`)."""
    _, entries, gpu = read_runs(folder, over)
    source = " over ".join(str(f) for f in reversed([*over, folder]))
    (folder / "paths.md").write_text(markdown(entries, gpu, source))
    return folder / "paths.md"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folders", nargs="+", type=Path, help="bench_kernels.py output folders")
    p.add_argument("--over", nargs="+", type=Path, default=[],
                   help="earlier runs of the same GPU (oldest first) that the one folder is read over")
    args = p.parse_args(argv)
    if args.over and len(args.folders) != 1:
        p.error("--over reads one run folder over earlier ones")
    for folder in args.folders:
        print(write(folder, args.over))
    return 0


if __name__ == "__main__":
    sys.exit(main())
