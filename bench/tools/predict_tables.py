"""The cost model's predicted 2-, 4- and 8-GPU tables of the collective-GEMM, MoE and end-to-end (TP block,
Llama) suites, beside the last measured multi-GPU numbers (CPU, no GPU).

    python bench/tools/predict_tables.py [--out-dir bench/results/predicted_<date>] [--ws 2,4,8] [--calibration h200] [--quiet]

Every number in a "pred" column is a prediction of ``overlap_backend.cost.model`` with a built-in calibration
(``cost.calibration.DEFAULTS``) and today's knobs and kernel ratios (``spec/kernel_ratios.json``): each op's GEMM
is priced on the path the runtime takes at that shape (cuBLAS, or the Triton kernel at its measured ratio). The
"meas" columns are copied from the committed results that ``bench/results/INDEX.md`` names as each suite's
current result (``MEASURED`` below); 8 GPUs were never measured, so those tables hold the 4-GPU tables' shapes
at ws 8, predictions only.

- collective GEMMs: plain (GEMM then NCCL), ours ``symm`` eagerly (the current defaults: private CUDA graphs, no
  host floor) and replayed from a CUDA graph, the decision, and the GEMM's path; measured: ``seq`` and
  ``ours_symm``, eager and replayed (the eager columns were measured without private graphs).
- MoE: the plain layer (NCCL all-to-alls + grouped GEMMs) and ours ``symm`` (no comm kernel, the default),
  eager and replayed; measured: ``baseline`` and ours with its run's settings.
- end to end: per step, the model's saving over the matched ops (plain minus ours, where it rewrites) and
  ``Inductor's measured step - that saving`` as the predicted step; measured: the Inductor and overlap steps.

Writes ``table.md``, ``predicted.json``, ``command.txt`` and a README into ``--out-dir``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from overlap_backend.cost import calibration as calibrate  # noqa: E402
from overlap_backend.cost.model import Problem, predict, ratio_gpu  # noqa: E402
from overlap_backend.spec import kernel_ratios  # noqa: E402

RESULTS = REPO / "bench" / "results"
# The current multi-GPU result of each suite (bench/results/INDEX.md); per (suite, ws) the first folder that
# holds the suite's JSON counts.
MEASURED = {
    "collective": {4: ["collective_gemm_h200x4_2026-11-30/run1"],
                   2: ["collective_gemm_h200x2_2026-12-01/ag_mm_cublas/run5", "collective_gemm_h200x2_2026-12-01/rs_tma/run5",
                       "collective_gemm_h200x2_2026-11-30/graphs_own_first/run5"]},
    "moe": {4: ["moe_h200x4_2026-11-30/run4"], 2: ["moe_h200x2_2026-12-01/no_comm_kernel/run3"]},
    "block": {4: ["block_h200x4_2026-11-30/run1/block_ws4.json"], 2: ["block_h200x2_2026-11-30/run4_block_ws2.json"]},
    "llama": {4: ["models_h200x4_2026-11-30/run2/models_ws4.json"], 2: ["models_h200x2_2026-12-01/run3/models_ws2.json"]},
    "llama graphs": {4: ["models_h200x4_2026-11-30/run4/models_cudagraphs_ws4.json"],
                     2: ["models_h200x2_2026-12-01/run5/models_cudagraphs_ws2.json"]},
}
BLOCK = dict(tokens=4 * 2048, hidden=4096, ffn=14336)  # bench_block.py's sizes
MOE_COMM_SMS = 0  # the runtime's default (no comm kernel: docs/cost_model.md)


def _check_module():
    spec = importlib.util.spec_from_file_location("check_cost_model", REPO / "bench" / "suites" / "check_cost_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _r(x):
    return None if x is None else float(f"{x:.4g}")


def _fmt(x) -> str:
    return "—" if x is None else f"{x:.3f}"


def _first(suite: str, ws: int, name: str | None = None) -> Path | None:
    for folder in MEASURED[suite].get(ws, []):
        path = RESULTS / folder / name if name else RESULTS / folder
        if path.is_file():
            return path
    return None


def ratio_sources(cal) -> str:
    """The results folders of the installed kernel ratios that price ``cal``'s GPU."""
    gpu = ratio_gpu(cal)
    found = sorted({e.get("source", "?") for e in kernel_ratios.entries() if e["gpu"] == gpu})
    return f"{gpu}: " + ", ".join(found) if found else f"none measured for {gpu}"


def _gemm_path(plan) -> str:
    t = plan.terms
    if "torch_sum" in t:
        return "cuBLAS + " + ("torch.sum" if t["torch_sum"] else f"sum kernel ×{t['sum_ratio']:.2f}")
    if t.get("cublas_gemms"):
        return "cuBLAS"
    if "gemm_ratio" in t:
        return f"Triton ×{t['gemm_ratio']:.2f}"
    return "Triton"


def _ours(p: Problem, cal, graphs: bool, **kw):
    pred = predict(p, cal, ["symm"], cuda_graphs=graphs, **kw)
    (plan,) = [q for q in pred.plans if q.lowering == "symm"] or [pred.best]
    return pred, plan


# ------------------------------------------------------------------------------------------- suites
def collective(ws: int, cal, check) -> list[dict]:
    """One row per shape of the suite's table at ``ws`` (ws 8: the 4-GPU shapes)."""
    src_ws = ws if ws in MEASURED["collective"] else 4
    rows = []
    for suite in ("ag_mm", "mm_rs", "mm_ar"):
        path = _first("collective", src_ws, f"{suite}_ws{src_ws}.json")
        if path is None:
            continue
        measured: dict[str, dict] = {}
        for r in check.collective_rows(path):
            measured.setdefault(r["shape"], {})[r["column"]] = r["measured"]
        for r in json.loads(path.read_text())["rows"]:
            m, k, n = int(r["M"]), int(r["K"]), int(r["N"])
            p = Problem(suite, m=m, n=n, k=k // ws if suite == "mm_rs" else k, dtype="bfloat16", ws=ws)
            eager, plan = _ours(p, cal, False)
            _, graph_plan = _ours(p, cal, True)
            meas = measured.get(f"{m}x{k}x{n}", {}) if src_ws == ws else {}
            rows.append(dict(suite="collective", op=suite, ws=ws, shape=f"{m}x{k}x{n}",
                             pred_plain=_r(eager.baseline_ms), pred_ours=_r(plan.ms), pred_ours_graph=_r(graph_plan.ms),
                             decision="rewrite" if plan.ms < (1 - _margin()) * eager.baseline_ms else "keep plain",
                             gemm_path=_gemm_path(plan),
                             meas_plain=_r(meas.get("seq")), meas_ours=_r(meas.get("ours_symm")),
                             meas_plain_graph=_r(meas.get("seq (graph)")), meas_ours_graph=_r(meas.get("ours_symm (graph)"))))
    return rows


def _margin() -> float:
    from overlap_backend.spec import knobs

    return knobs.cost.MARGIN


def moe(ws: int, cal, check) -> list[dict]:
    rows = []
    path = _first("moe", ws, f"moe_ws{ws}.json")
    measured: dict[str, dict] = {}
    problems: dict[str, Problem] = {}
    if path is not None:
        for r in check.moe_rows(path):
            measured.setdefault(r["shape"], {})[r["column"]] = r["measured"]
            problems[r["shape"]] = r["problem"]
    else:  # never measured at this size: every config whose experts split over ws, balanced routing
        for name, (h, f, experts, top_k, tokens) in check.MOE_CONFIGS.items():
            if experts % ws or (name == "deepseek-ep8" and ws != 8):
                continue
            problems[f"{name} balanced"] = Problem("moe_experts", m=tokens * top_k, n=h, k=h, f=f,
                                                   experts=experts // ws, rows_sent=tokens * top_k,
                                                   dtype="bfloat16", ws=ws)
    for shape, p in problems.items():
        eager, plan = _ours(p, cal, False, comm_sms=MOE_COMM_SMS)
        _, graph_plan = _ours(p, cal, True, comm_sms=0)
        meas = measured.get(shape, {})
        rows.append(dict(suite="moe", op="moe_experts", ws=ws, shape=shape, rows=p.m,
                         pred_plain=_r(eager.baseline_ms), pred_ours=_r(plan.ms), pred_ours_graph=_r(graph_plan.ms),
                         decision="rewrite" if plan.ms < (1 - _margin()) * eager.baseline_ms else "keep plain",
                         gemm_path="torch._grouped_mm" if plan.terms.get("cublas_gemms") else "Triton (fitted)",
                         meas_plain=_r(meas.get("baseline")), meas_ours=_r(meas.get("symm (defaults)")),
                         meas_plain_graph=_r(meas.get("baseline (graph)")), meas_ours_graph=_r(meas.get("symm (graph)"))))
    return rows


def block_problems(ws: int, tokens: int, hidden: int, ffn: int) -> dict[str, Problem]:
    """The TP block's eight matches (bench_block.py: QKV as one weight, fc1 + GELU, out-proj, fc2)."""
    bf = "bfloat16"
    return {
        "fwd ag_mm x -> QKV": Problem("ag_mm", tokens, 3 * hidden // ws, hidden, bf, ws),
        "fwd ag_mm x -> fc1": Problem("ag_mm", tokens, ffn // ws, hidden, bf, ws),
        "fwd mm_rs out-proj": Problem("mm_rs", tokens, hidden, hidden // ws, bf, ws),
        "fwd mm_rs fc2": Problem("mm_rs", tokens, hidden, ffn // ws, bf, ws),
        "bwd ag_mm dy -> out-proj^T": Problem("ag_mm", tokens, hidden // ws, hidden, bf, ws),
        "bwd ag_mm dy -> fc2^T": Problem("ag_mm", tokens, ffn // ws, hidden, bf, ws),
        "bwd mm_rs dQKV": Problem("mm_rs", tokens, hidden, 3 * hidden // ws, bf, ws),
        "bwd mm_rs dfc1": Problem("mm_rs", tokens, hidden, ffn // ws, bf, ws),
    }


def _saving(problems, cal, graphs: bool) -> tuple[float, int, float]:
    """(predicted ms saved per block, matches rewritten, the matched ops' plain time)."""
    saved, rewritten, plain = 0.0, 0, 0.0
    for p in problems.values():
        pred, plan = _ours(p, cal, graphs)
        plain += pred.baseline_ms
        if plan.ms < (1 - _margin()) * pred.baseline_ms:
            saved += pred.baseline_ms - plan.ms
            rewritten += 1
    return saved, rewritten, plain


def _variant_ms(data: dict, variant: str) -> float | None:
    if "variants" in data:
        vs = data["variants"]
    else:
        vs = data["sections"]["llama"]["variants"]
    for v in vs:
        if v["variant"] == variant:
            return v.get("time_ms", v.get("step_ms"))
    return None


def end_to_end(ws: int, cal) -> list[dict]:
    sys.path.insert(0, str(REPO / "bench" / "tools"))
    import predict_llama

    rows = []
    cases = [("TP block (fwd + bwd)", "block", None, 1, block_problems(ws, **BLOCK), False)]
    L = predict_llama.LLAMA
    llama = predict_llama.block_problems(ws, L["dim"], L["n_heads"], L["n_kv_heads"], L["ffn_dim"], L["batch"] * L["seq"])
    cases += [("Llama TP+SP step, eager", "llama", "models", L["n_layers"], llama, False),
              ("Llama TP+SP step, CUDA graphs", "llama graphs", "models", L["n_layers"], llama, True)]
    for label, suite, _, layers, problems, graphs in cases:
        saved, rewritten, plain = _saving(problems, cal, graphs)
        path = _first(suite, ws)
        data = json.loads(path.read_text()) if path else None
        inductor = _variant_ms(data, "inductor") if data else None
        ours = (_variant_ms(data, "overlap_symm") or _variant_ms(data, "overlap")) if data else None
        rows.append(dict(suite="end_to_end", op=label, ws=ws, shape=f"{layers} block(s) x {len(problems)} matches",
                         matches_rewritten=rewritten * layers, pred_matched_plain=_r(plain * layers),
                         pred_saving=_r(saved * layers),
                         pred_step=_r(inductor - saved * layers) if inductor is not None else None,
                         meas_inductor=_r(inductor), meas_ours=_r(ours),
                         source=str(path.relative_to(RESULTS)) if path else None))
    return rows


# ------------------------------------------------------------------------------------------ output
def markdown(rows: list[dict], world_sizes, cal_name: str, command: str) -> str:
    out = ["# Predicted tables (cost model, CPU): predictions beside the last measurements", "",
           f"`{command}`", "",
           f"**Predictions**, not measurements: `overlap_backend.cost.model` with the built-in `{cal_name}` calibration, "
           "today's knobs and kernel ratios; every GEMM priced on the path the runtime takes at its shape. "
           "`pred` columns are the model's, `meas` columns are copied from the results named in each section "
           "(ms; — : not measured). 8 GPUs were never measured.", ""]
    for ws in world_sizes:
        out += [f"## {ws} GPUs", ""]
        col = [r for r in rows if r["ws"] == ws and r["suite"] == "collective"]
        if col:
            out += ["### Collective GEMMs (M×K×N, bf16)", "",
                    "| op | M×K×N | pred plain | pred ours symm | pred decision | GEMM path | meas plain | meas ours symm "
                    "| pred ours (graph) | meas plain (graph) | meas ours (graph) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
            out += [f"| {r['op']} | {r['shape']} | {_fmt(r['pred_plain'])} | {_fmt(r['pred_ours'])} | {r['decision']} | "
                    f"{r['gemm_path']} | {_fmt(r['meas_plain'])} | {_fmt(r['meas_ours'])} | {_fmt(r['pred_ours_graph'])} | "
                    f"{_fmt(r['meas_plain_graph'])} | {_fmt(r['meas_ours_graph'])} |" for r in col]
            src = MEASURED["collective"].get(ws)
            out += ["", f"Measured: {', '.join(src) if src else 'never (the 4-GPU shapes, predicted at 8 GPUs)'}. "
                    "Eager `meas ours` was measured without private graphs; `pred ours` has them (the default).", ""]
        mo = [r for r in rows if r["ws"] == ws and r["suite"] == "moe"]
        if mo:
            out += ["### MoE layer", "",
                    "| config | grouped rows | pred plain | pred ours symm | pred decision | expert GEMMs | meas plain "
                    "| meas ours symm | pred ours (graph) | meas plain (graph) | meas ours (graph) |",
                    "|---|---|---|---|---|---|---|---|---|---|---|"]
            out += [f"| {r['shape']} | {r['rows']} | {_fmt(r['pred_plain'])} | {_fmt(r['pred_ours'])} | {r['decision']} | "
                    f"{r['gemm_path']} | {_fmt(r['meas_plain'])} | {_fmt(r['meas_ours'])} | {_fmt(r['pred_ours_graph'])} | "
                    f"{_fmt(r['meas_plain_graph'])} | {_fmt(r['meas_ours_graph'])} |" for r in mo]
            src = MEASURED["moe"].get(ws)
            out += ["", f"Measured: {', '.join(src) if src else 'never (balanced routing, predicted)'}; "
                    "`meas ours` ran with its run's comm SMs, `pred ours` with none (the default).", ""]
        e2e = [r for r in rows if r["ws"] == ws and r["suite"] == "end_to_end"]
        if e2e:
            out += ["### End to end (per step)", "",
                    "| model | matches | rewritten (pred) | pred matched ops plain | pred saving | pred step "
                    "(meas Inductor − pred saving) | meas Inductor | meas overlap | measured in |",
                    "|---|---|---|---|---|---|---|---|---|"]
            out += [f"| {r['op']} | {r['shape']} | {r['matches_rewritten']} | {_fmt(r['pred_matched_plain'])} | "
                    f"{_fmt(r['pred_saving'])} | {_fmt(r['pred_step'])} | {_fmt(r['meas_inductor'])} | "
                    f"{_fmt(r['meas_ours'])} | {r['source'] or '—'} |" for r in e2e]
            out.append("")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=str(RESULTS / f"predicted_{today}"))
    ap.add_argument("--ws", default="2,4,8")
    ap.add_argument("--calibration", default="h200", choices=sorted(calibrate.DEFAULTS))
    ap.add_argument("--quiet", action="store_true", help="write the files without printing the tables")
    args = ap.parse_args(argv)
    world_sizes = [int(w) for w in args.ws.split(",")]
    cal = calibrate.DEFAULTS[args.calibration]
    check = _check_module()
    rows = []
    for ws in world_sizes:
        rows += collective(ws, cal, check) + moe(ws, cal, check) + end_to_end(ws, cal)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    command = "python bench/tools/predict_tables.py" + "".join(
        f" {shlex.quote(a)}" for a in (argv if argv is not None else sys.argv[1:]))
    md = markdown(rows, world_sizes, args.calibration, command)
    (out / "table.md").write_text(md)
    (out / "predicted.json").write_text(json.dumps({"calibration": cal.key, "world_sizes": world_sizes,
                                                    "measured_from": MEASURED, "rows": rows}, indent=1) + "\n")
    (out / "command.txt").write_text(command + "\n")
    (out / "README.md").write_text(
        f"# Predicted tables, {today}\n\nThe cost model's 2-, 4- and 8-GPU tables of the collective-GEMM, MoE and "
        "end-to-end suites beside the last measured multi-GPU numbers: **predictions** (CPU, no GPU), labelled "
        "`pred`, next to measurements labelled `meas`.\n\n"
        f"```bash\n{command}\n```\n\nFiles: [table.md](table.md), predicted.json, command.txt. Calibration: the "
        f"built-in `{args.calibration}` defaults (`{cal.key}`); kernel ratios: `overlap_backend/spec/kernel_ratios.json` "
        f"({ratio_sources(cal)}).\n")
    if not args.quiet:
        print(md)
    print(f"wrote {out}/table.md ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
