"""Kernel benchmark of record (one GPU, no communication): every GEMM kernel the overlap ops run, alone,
against cuBLAS on the same local GEMM.

    python bench/suites/bench_kernels.py --out bench/results/kernels_h200x1_<date> [--quick] [--dry-run]
        [--kernels ag_mm,mm_rs,mm_ar,oneshot,cta_stage0,cta_stage1,cta_stage0_cublas,cta_stage1_cublas,
                   moe_gate_up,moe_down,moe_grouped_mm,ag_mm_cublas,mm_rs_cublas,mm_ar_cublas] [--ws 2,4,8]
        [--max-rows M] [--budget-s 300] [--jobs N] [--reps 30] [--no-variants] [--rerender]

Kernels (``codegen/``): the ``ag_mm`` consumer, the ``mm_rs`` producer, the same kernel as ``mm_ar``'s
rounds (``WRITE_GATHER``), the one-shot all-reduce sum, the CTA op's stage-0 / stage-1 kernels and the
MoE grouped GEMMs (gate/up with SwiGLU fused, down); the cuBLAS paths the collective GEMMs take where their
kernels lose (``runtime/symm``'s ``ag_mm_cublas``, ``mm_rs_cublas``, ``mm_ar_cublas`` on ``kernel_setups.AloneGroup``: a GEMM
per chunk or band, the flag writes and waits, the partials' sum; no transfers); and the CTA stages' cuBLAS forms
(``runtime/cta_cublas.py``: a GEMM per row group and K-chunk into the staged blocks, the activation a
separate pass; stage 1's accumulating ``addmm`` per arrived block) and the MoE experts' ``torch._grouped_mm``
form (``runtime/moe_grouped.py``: per segment, gather, both grouped GEMMs with SwiGLU between, scatter; against
the two grouped GEMMs on rows already sorted), with their flag steps left out. Each runs as rank 0 of a
``ws``-rank group with every flag raised (epoch 0) and the peers' data already local, at the local shapes of the 2-, 4- and
8-GPU tables of every suite (collective GEMMs, TP block, Llama, MoE DeepSeek-/Mixtral-like, CTA MLP)
and at decode sizes, deduplicated (``kernel_cases.cases``; each case's set-up: ``kernel_setups.Bench``). Per case: the op's tuning candidates
(``codegen.configs.candidates``, what the op's tuner picks from) and the bench-only variants
(``knobs.codegen.VARIANTS_16BIT``: store variants, other stages / GROUP_M), each checked against a
float32 reference on random inputs with its outputs NaN-poisoned first, then timed call by call against
the baseline: GPU time, CUDA events around each call after warm-up, the calls alternating with the
baseline's and enqueued behind a GPU spin so that none waits for its launch
(``common.paired_queued_ms``: the host's launch time, recorded beside it, is not in it, as in the ops'
CUDA graphs; the GPU's clock moves under a sustained load, and neighbouring calls run at the same
clock); a config's ratio is the median over ``--reps`` calls of each call's time over the baseline
calls beside it. The op's best config and the baseline also back to back, events only, where a launch
that takes longer than its kernel shows. Baselines: ``torch.mm`` / ``torch._grouped_mm`` on the same GEMM; with
a fused epilogue, cuBLAS plus torch's separate pointwise op (the stand-in for Inductor's pointwise
kernel, labelled so in the table); the one-shot sum against ``torch.sum`` over the partials.

Outputs in ``--out``: ``table.md`` (the table of record), ``results.json`` (every config's time and
error), ``kernel_ratios.json`` (the format of ``overlap_backend/spec/kernel_ratios.py``: installed into
``overlap_backend/spec/kernel_ratios.json`` by ``bench/tools/install_ratios.py``, the ops take cuBLAS where the
kernel measured slower than ``knobs.symm.CUBLAS_ABOVE_RATIO``), ``paths.md`` (``kernel_paths.py``: the path
each op takes at each shape on these ratios, and that path's ratio), ``variants.md`` (which variants beat the
op's candidates), ``README.md`` (machine, versions, the exact command); ``--rerender`` (no GPU) writes them again
from ``results.json``. Cold Triton caches: the kernel variants are
compiled first by ``--jobs`` worker processes (``launcher.preloading``), then timed in this one; the
run stops starting cases after ``--budget-s`` seconds and lists those it left out. ``--dry-run`` (no
GPU) builds the case list and writes every output with made-up timings, to check the script.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from bench.suites import kernel_paths  # noqa: E402
from bench.suites.kernel_cases import CUBLAS_FORMS, KERNELS, WORLD_SIZES, Case, cases  # noqa: E402
from bench.suites.kernel_setups import Bench, mm_ar_configs  # noqa: E402
from bench.tools import common  # noqa: E402

CHECK_TOL = 1e-2  # bf16 against float32


def _first_error(fn, dev) -> str | None:
    try:
        fn()
        common.synchronize(dev)
    except Exception as e:  # noqa: BLE001 - a variant that does not compile (or fit) is reported, not fatal
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
    return None


def measure(case: Case, origins: list[str], dev, num_sms: int, reps: int, variants: bool,
            deadline: float = math.inf) -> dict:
    row = {"case": dataclasses.asdict(case), "label": case.label(), "suites": origins}
    try:
        b = Bench(case, dev, num_sms, reps)
    except Exception as e:  # noqa: BLE001
        row["error"] = f"set-up failed: {type(e).__name__}: {str(e)[:300]}"
        return row
    row["baseline"] = b.baseline[0]
    t = b.time(b.baseline[1])  # alone: its host time, and its GPU time without the configs' calls between
    row["baseline_alone_ms"], row["baseline_host_us"], queued = t.ms, t.host_us, [t.queued]
    paired_baseline = []  # the baseline's median beside each paired timing
    if b.with_sum is not None:  # mm_rs / mm_ar: also against the baseline plus the reduce-scatter's sum
        t = b.time_paired(b.with_sum[1])
        row["with_sum"], row["with_sum_ms"], row["with_sum_ratio"] = b.with_sum[0], t.ms, t.ratio
        paired_baseline.append(t.baseline_ms)
        queued.append(t.queued)
    configs = [(cfg, "op") for cfg in b.op_cands] + ([(cfg, "variant") for cfg in b.variant_cands] if variants else [])
    results = []
    for cfg, kind in configs:
        r = {"config": list(cfg) if cfg is not None else None, "kind": kind}
        if time.time() > deadline:  # (a variant left uncompiled would compile here, tens of seconds)
            r["error"] = "not run (time box)"
            results.append(r)
            continue
        why, err, t = _check_then_time(b, lambda cfg=cfg: b.run(cfg), lambda cfg=cfg: b.check(cfg))
        if err is not None:
            r["rel_err"] = err
        if why is None:
            r["ms"], r["ratio"], r["baseline_ms"], r["host_us"] = t.ms, t.ratio, t.baseline_ms, t.host_us
            paired_baseline.append(t.baseline_ms)
            queued.append(t.queued)
        else:
            r["error"] = why
        results.append(r)
    row["baseline_ms_runs"] = paired_baseline or [row["baseline_alone_ms"]]
    row["baseline_ms"] = statistics.median(row["baseline_ms_runs"])
    row["configs"] = results
    summarize(row)
    if b.run_apart is not None and "op_config" in row:  # the op's other way with an epilogue: kernel plain, epilogue apart
        _measure_apart(b, row, queued, deadline)
    row["all_queued"] = all(queued)  # (False: some call waited on the GPU, its time includes host time)
    if "op_config" in row:  # what back-to-back event timing reads at this case (the host's launch time where longer)
        op_cfg = tuple(row["op_config"]) if row["op_config"] is not None else None
        row["back_to_back_ms"] = {"baseline": b.back_to_back_ms(b.baseline[1]),
                                  "op": b.back_to_back_ms(lambda: b.run(op_cfg))}
    b = None  # its tensors freed before the next case (the lambdas above are done with it)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row


def _measure_apart(b, row: dict, queued: list, deadline: float) -> None:
    """``apart_ratio``: the op's best config run without its epilogue, the epilogue then applied by torch as the
    op does where fusing it measured slower (``spec.kernel_ratios.fuses_epilogue``), over the same baseline
    (cuBLAS plus the separate epilogue), call by call; checked against the fused case's reference first."""
    cfg = tuple(row["op_config"]) if row["op_config"] is not None else None
    if time.time() > deadline:
        row["apart_error"] = "not run (time box)"
        return
    why, _, t = _check_then_time(b, lambda: b.run_apart(cfg), lambda: b.apart_error(cfg))
    if why is not None:
        row["apart_error"] = why
        return
    row["apart_ms"], row["apart_ratio"] = t.ms, t.ratio
    queued.append(t.queued)


def _check_then_time(b, run, check) -> tuple[str | None, float | None, object]:
    """(why ``run`` failed, or None; ``check()``'s relative error, where it ran; its ``b.time_paired`` where
    it passed). A run that does not compile or fit, or computes wrong, is reported, not timed. Timed call by
    call against cuBLAS: the GPU's clock moves under a sustained load, and timings made one after the other
    (the baseline before and after a case's configs) differed by up to 17 % on one GPU."""
    why = _first_error(run, b.dev)
    if why is not None:
        return why, None, None
    err = check()
    if not err <= CHECK_TOL:
        return f"WRONG (rel err {err:.2e})", err, None
    return None, err, b.time_paired(run)


def summarize(row: dict) -> None:
    """The op's time (best of its tuning candidates), the best variant's, in ``row``: the best by its ratio
    to the baseline beside it (each config's time was taken at its own moment's clock)."""
    ok = [r for r in row.get("configs", ()) if "ms" in r]
    op = [r for r in ok if r["kind"] == "op"]
    if op:
        best = min(op, key=lambda r: r["ratio"])
        row.update(op_ms=best["ms"], op_config=best["config"], op_ratio=best["ratio"], op_host_us=best.get("host_us"))
    if ok:
        best = min(ok, key=lambda r: r["ratio"])
        row.update(best_ms=best["ms"], best_config=best["config"], best_kind=best["kind"], best_ratio=best["ratio"])
    if op and row.get("with_sum_ratio"):  # both ratios to the baseline beside them: op / (baseline + sum)
        row["op_ratio_with_sum"] = row["op_ratio"] / row["with_sum_ratio"]
    row["failed"] = [f"{r['config']}: {r['error']}" for r in row.get("configs", ()) if "error" in r]


def fake_measure(case: Case, origins: list[str], variants: bool) -> dict:
    """--dry-run: the row ``measure`` would write, with made-up times (a hash of the case and config)."""
    def h(*parts) -> float:
        return int(hashlib.sha256(repr(parts).encode()).hexdigest()[:8], 16) / 0xFFFFFFFF

    from overlap_backend.codegen import configs as cfgs

    rows = case.M // case.ws
    if case.kernel in ("ag_mm", "mm_rs"):
        op = cfgs.candidates(torch.bfloat16, tma_store_rows=rows, variants=False, kernel=case.kernel)
        var = cfgs.variant_candidates(torch.bfloat16, case.kernel, tma_store_rows=rows)
    elif case.kernel == "mm_ar":
        _, _, op, var = mm_ar_configs(torch.bfloat16, case.M, case.ws)
    else:
        op, var = [None], []
    base = 2 * case.M * case.K * case.N / 700e9 + 0.01
    row = {"case": dataclasses.asdict(case), "label": case.label(), "suites": origins, "baseline": "(dry run)",
           "baseline_ms": base, "baseline_host_us": 8.0, "all_queued": True, "configs": []}
    if case.kernel in ("mm_rs", "mm_ar", "mm_rs_cublas", "mm_ar_cublas"):
        row["with_sum"], row["with_sum_ratio"] = "(dry run) + sum", 1.1 + 0.1 * h(case)
        row["with_sum_ms"] = base * row["with_sum_ratio"]
    for cfg, kind in [(c, "op") for c in op] + ([(c, "variant") for c in var] if variants else []):
        ms = base * (0.95 + 0.4 * h(case, cfg))
        row["configs"].append({"config": list(cfg) if cfg else None, "kind": kind, "ms": ms, "ratio": ms / base,
                               "rel_err": 1.7e-3, "host_us": 20 + 40 * h(cfg)})
    summarize(row)
    if case.kernel == "ag_mm" and case.epilogue:
        row["apart_ratio"] = row["op_ratio"] * (0.9 + 0.2 * h(case, "apart"))
    row["back_to_back_ms"] = {"baseline": max(base, 0.008), "op": max(row["op_ms"], row["op_host_us"] / 1e3)}
    return row


# ----------------------------------------------------------------------------------- compilation
def _compile_job(job) -> tuple[int, str | None, float]:
    """Worker: compile and load one (case, config) without launching (``launcher.preloading``)."""
    index, case, cfg = job
    t0 = time.time()
    try:
        import triton

        from overlap_backend.codegen import launcher

        dev = torch.device("cuda")
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))
        num_sms = torch.cuda.get_device_properties(dev).multi_processor_count
        b = Bench(case, dev, num_sms, 1)
        with launcher.preloading():
            b.run(b.op_cands[0] if cfg is None else cfg)  # None: the config the case's set-up derives
        return index, None, time.time() - t0
    except Exception as e:  # noqa: BLE001 - the timing pass reports it again
        return index, f"{type(e).__name__}: {str(e)[:200]}", time.time() - t0


def compile_jobs(todo: list[tuple[Case, list[str]]], variants: bool) -> list[tuple[int, Case, object]]:
    """One (case, config) per kernel variant to compile: configs of the same kernel, ws and epilogue
    compile once (other integer sizes with the same divisibility reuse the binary)."""
    from overlap_backend.codegen import configs as cfgs

    jobs, seen = [], set()
    for case, _ in todo:
        rows = case.M // case.ws
        if case.kernel in CUBLAS_FORMS:
            continue
        if case.kernel in ("ag_mm", "mm_rs"):
            cands = cfgs.candidates(torch.bfloat16, tma_store_rows=rows, variants=False, kernel=case.kernel)
            cands += cfgs.variant_candidates(torch.bfloat16, case.kernel, tma_store_rows=rows) if variants else []
        elif case.kernel == "mm_ar":
            _, _, op, var = mm_ar_configs(torch.bfloat16, case.M, case.ws)
            cands = op + (var if variants else [])
        else:  # configs derived in set-up (CTA, MoE): one job per case compiles its first
            cands = [None]
        for cfg in cands:
            key = (case.kernel, case.ws, cfg, case.epilogue) if cfg is not None else case
            if key not in seen:
                seen.add(key)
                jobs.append((len(jobs), case, cfg))
    return jobs


def precompile(todo, variants: bool, workers: int, deadline: float, settings=()) -> dict:
    """Compile every kernel variant in ``workers`` processes (into Triton's on-disk cache) before timing, each
    with the run's ``--set`` knobs ``settings`` (the configs the CTA and MoE set-ups derive read them); the
    jobs that ran out of GPU memory beside the others (each worker holds its case's tensors) go again one at a
    time."""
    jobs = compile_jobs(todo, variants)
    stats = {"jobs": len(jobs), "workers": workers, "failed": [], "done": 0, "retried": 0, "seconds": 0.0}
    if workers <= 0 or not jobs:
        return stats
    t0 = time.time()
    ran = _compile_in_pool(jobs, range(len(jobs)), workers, deadline, settings)
    stats["done"] = len(ran)
    out_of_memory = [i for i, err in ran.items() if err.startswith("OutOfMemoryError")]
    stats["retried"] = len(out_of_memory)
    if out_of_memory:
        ran.update(_compile_in_pool(jobs, out_of_memory, 1, deadline, settings))
    stats["failed"] = [f"{jobs[i][1].label()} {jobs[i][2]}: {err}" for i, err in sorted(ran.items()) if err]
    stats["seconds"] = time.time() - t0
    return stats


def _compile_in_pool(jobs, indices, workers: int, deadline: float, settings=()) -> dict[int, str]:
    """``_compile_job`` on ``jobs[i]`` for each of ``indices`` in ``workers`` spawned processes, the knobs
    ``settings`` set in each, until ``deadline``: {index: error, "" where it compiled} of every job that
    finished."""
    import multiprocessing as mp

    ran = {}
    pool = mp.get_context("spawn").Pool(workers, initializer=common.apply_sets, initargs=(list(settings),))
    try:
        pending = [pool.apply_async(_compile_job, (jobs[i],)) for i in indices]
        for res in pending:
            left = deadline - time.time()
            if left <= 0:
                break
            try:
                index, err, _ = res.get(timeout=left)
            except mp.TimeoutError:
                break
            ran[index] = err or ""
    finally:
        pool.terminate()
        pool.join()
    return ran


# ------------------------------------------------------------------------------------------ output
def config_label(cfg) -> str:
    if cfg is None:
        return "-"
    BM, BN, BK, G, st, w, *rest = cfg  # rest: a store variant (bool or name); the CTA stages' split-K runs (int)
    tail = ""
    for item in rest:
        if isinstance(item, bool):
            tail += " tma" if item else ""
        elif isinstance(item, int):
            tail += f" split-K {item}" if item > 1 else " no split"
        else:
            tail += f" {item}"
    return f"{BM}x{BN}x{BK} g{G} s{st} w{w}{tail}"


def table_markdown(rows: list[dict], info: dict, skipped: list[str]) -> str:
    head = ["kernel", "ws", "local M×K×N", "fused epilogue", "suites", "baseline", "baseline ms", "op kernel ms",
            "op / baseline", "op / (baseline + sum)", "epilogue apart / baseline", "op config", "best variant ms", "best / baseline", "best config", "rel err",
            "host µs op / baseline", "back to back op / baseline"]
    body = []
    for r in rows:
        c = r["case"]
        if "error" in r:
            body.append([c["kernel"], c["ws"], f"{c['M']}×{c['K']}×{c['N']}", c["epilogue"] or "-", "; ".join(r["suites"]),
                         r["error"], "", "", "", "", "", "", "", "", "", "", "", ""])
            continue
        errs = [x["rel_err"] for x in r.get("configs", ()) if "rel_err" in x]
        flag = lambda v: "" if v is None else (" **>1.03**" if v > 1.03 else "")  # noqa: E731
        body.append([
            c["kernel"], c["ws"], f"{c['M']}×{c['K']}×{c['N']}" + (f" ({c['moe']})" if c["moe"] else ""),
            c["epilogue"] or "-", "; ".join(r["suites"]), r["baseline"], common.fmt_ms(r["baseline_ms"]),
            common.fmt_ms(r.get("op_ms")), (f"{r['op_ratio']:.3f}" + flag(r["op_ratio"])) if "op_ratio" in r else "n/a",
            (f"{r['op_ratio_with_sum']:.3f}" + flag(r["op_ratio_with_sum"])) if "op_ratio_with_sum" in r else "-",
            (f"{r['apart_ratio']:.3f}" + flag(r["apart_ratio"])) if "apart_ratio" in r else r.get("apart_error", "-"),
            config_label(r.get("op_config")), common.fmt_ms(r.get("best_ms")),
            f"{r['best_ratio']:.3f}" if "best_ratio" in r else "n/a",
            config_label(r.get("best_config")) + (" (variant)" if r.get("best_kind") == "variant" else ""),
            f"{max(errs):.1e}" if errs else "n/a",
            f"{r['op_host_us']:.0f} / {r['baseline_host_us']:.0f}" if r.get("op_host_us") else "n/a",
            _back_to_back(r)])
    text = [f"# The op kernels alone against cuBLAS ({info.get('gpu', '?')})", "",
            f"`{info['command']}`", "", common.info_markdown(info), "",
            "Ratios are the kernel's time over the baseline's on the same local GEMM (fused epilogue: over cuBLAS "
            "plus torch's separate pointwise op, the stand-in for Inductor's kernel), call by call: the median of "
            "each call's time over the baseline calls beside it, the two alternating (the GPU's clock moves under "
            "a sustained load); `baseline ms`: the baseline's median beside the row's configs. `op kernel`: the best of the "
            "op's tuning candidates (what the op runs); `best variant`: the best of those and the bench-only "
            "variants. **>1.03**: the ops take cuBLAS there once kernel_ratios.json is installed. `ag_mm_cublas`, "
            "`mm_rs_cublas`, `mm_ar_cublas`: what the op then runs, its cuBLAS path (the GEMM per chunk or band, "
            "the flag writes, the sum of the partials; no transfers) over one cuBLAS GEMM. `cta_stage<i>_cublas`: the "
            "op's cuBLAS form of that CTA stage over the same baseline (the stage takes it under \"auto\" only where "
            "it beats the stage's kernel); `moe_grouped_mm`: the MoE experts' torch._grouped_mm form (gather, both "
            "GEMMs, scatter) over the grouped GEMMs on sorted rows. Times are GPU times with every call queued "
            "(the ops replay CUDA graphs); `host µs`: the host's time to enqueue one call; `back to back`: the "
            "ratio as event timing of calls enqueued as they run reads it, where a launch slower than its "
            "kernel counts (†: some call of the row waited on the GPU while queued, so its times hold host time). "
            "`op / (baseline + sum)` (`mm_rs`, `mm_ar` and their cuBLAS paths): over the baseline followed by "
            "`torch.sum` of this rank's ws partials, the sum that the unfused reduce-scatter or all-reduce does and "
            "that these ops do in their GEMM's epilogue. `epilogue apart` (`ag_mm` with an epilogue): the op's config "
            "run plain, the epilogue's torch step after it, over the same baseline: what the op runs where that "
            "measured faster than fused (`knobs.symm.EPILOGUE_APART_GAIN`).",
            "",
            common.markdown_table(head, body)]
    failures = [f"- {r['label']}: {f}" for r in rows for f in r.get("failed", ())]
    if failures:
        text += ["", "## Configs that did not compile, fit or check", "", *failures]
    if skipped:
        text += ["", "## Not run (time box)", "", *[f"- {s}" for s in skipped]]
    return "\n".join(text) + "\n"


def _back_to_back(row: dict) -> str:
    b2b = row.get("back_to_back_ms")
    if not b2b:
        return "n/a"
    return f"{b2b['op'] / b2b['baseline']:.3f}" + ("" if row.get("all_queued", True) else " †")


def variants_markdown(rows: list[dict]) -> str:
    """Per variant config: at how many cases it ran, beat the op's best, and its geometric-mean ratio to it. Each
    config's time is compared through its ratio to the baseline timed beside it (``summarize``'s measure): times
    taken at different moments compare the GPU's clock states too."""
    stats: dict[str, list[float]] = {}
    for r in rows:
        op = r.get("op_ratio")
        for x in r.get("configs", ()):
            if x["kind"] == "variant" and op:
                key = f"{r['case']['kernel']} {config_label(x['config'])}"
                stats.setdefault(key, []).append(x["ratio"] / op if "ratio" in x else math.nan)
    body = []
    for key, v in sorted(stats.items()):
        ok = [x for x in v if not math.isnan(x)]
        gm = statistics.geometric_mean(ok) if ok else math.nan
        body.append([key, len(v), len(v) - len(ok), sum(x < 0.99 for x in ok), f"{gm:.3f}" if ok else "n/a",
                     f"{min(ok):.3f}" if ok else "n/a"])
    return ("# Bench-only kernel variants against the op's best candidate\n\nPer variant: cases, failed "
            "(compile / fit / check), cases where it beat the op's best by >1%, geometric mean and best of "
            "variant / op-best time (each as its ratio to the baseline timed beside it). Promote winners into "
            "`knobs.codegen.CANDIDATES_16BIT` or set `codegen.TUNE_VARIANTS=True`.\n\n" + common.markdown_table(
                ["variant", "cases", "failed", "wins", "geo-mean / op best", "best / op best"], body) + "\n")


def ratio_entries(rows: list[dict], info: dict, out: str) -> list[dict]:
    """``spec/kernel_ratios.py`` entries: the op's ratio (its tuning candidates) at every measured case."""
    entries = []
    for r in rows:
        if "op_ratio" not in r:
            continue
        c = r["case"]
        entries.append({"gpu": info.get("gpu", "?"), "kernel": c["kernel"], "dtype": "bfloat16", "ws": c["ws"],
                        "M": c["M"], "K": c["K"], "N": c["N"], "fused": bool(c["epilogue"]),
                        "epilogue": c["epilogue"], "moe": c["moe"], "ratio": round(r["op_ratio"], 4),
                        "kernel_ms": round(r["op_ms"], 4), "baseline_ms": round(r["baseline_ms"], 4),
                        "config": r["op_config"], "best_variant_ratio": round(r.get("best_ratio", r["op_ratio"]), 4),
                        "best_config": r.get("best_config"), "variants": kernel_paths.measured_variants(r),
                        "source": out,
                        **({"ratio_with_sum": round(r["op_ratio_with_sum"], 4)} if "op_ratio_with_sum" in r else {}),
                        **({"apart_ratio": round(r["apart_ratio"], 4)} if "apart_ratio" in r else {})})
    return entries


def write_outputs(out: Path, rows, info, skipped, compile_stats) -> None:
    from overlap_backend.spec import kernel_ratios

    out.mkdir(parents=True, exist_ok=True)
    common.write_json(out / "results.json", {"info": info, "compile": compile_stats, "rows": rows, "skipped": skipped})
    (out / "table.md").write_text(table_markdown(rows, info, skipped))
    (out / "variants.md").write_text(variants_markdown(rows))
    doc = kernel_ratios.document(ratio_entries(rows, info, str(out)),
                                 f"bench/suites/bench_kernels.py, {info.get('gpu')}, torch {info.get('torch')}, "
                                 f"triton {info.get('triton')}, {info.get('date')}")
    (out / "kernel_ratios.json").write_text(json.dumps(doc, indent=1) + "\n")
    kernel_paths.write(out)
    (out / "command.txt").write_text(info["command"] + "\n")
    (out / "README.md").write_text(
        f"# Kernel benchmark of record, {info.get('gpu')}\n\n{common.info_markdown(info)}\n\n"
        f"Cases: {len(rows)} measured, {len(skipped)} left out by the time box; compilation: "
        f"{compile_stats.get('jobs', 0)} variants in {compile_stats.get('workers', 0)} processes, "
        f"{compile_stats.get('seconds', 0):.0f} s, {len(compile_stats.get('failed', []))} failed "
        f"({compile_stats.get('retried', 0)} retried alone after running out of GPU memory beside the others; "
        "a variant that failed here is compiled again when its case is timed).\n\n"
        "Files: [table.md](table.md) (the kernel table), [paths.md](paths.md) (the path each op takes at each "
        "shape on these ratios, and its ratio), [variants.md](variants.md), results.json, "
        "kernel_ratios.json (install: `python bench/tools/install_ratios.py DIR`).\n")


def run_info(dry: bool, argv: list[str]) -> dict:
    import triton

    info = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": platform.node(),
            "python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
            "world_size": 1, "gpu_count_visible": torch.cuda.device_count() if not dry else 0,
            "env": {k: os.environ.get(k) for k in (*common.SAFE_ENV, "CUDA_VISIBLE_DEVICES")},
            "command": " ".join(["python bench/suites/bench_kernels.py", *(shlex.quote(a) for a in argv)])}
    if dry:
        info["gpu"] = "NVIDIA H200 (dry run, made-up times)"
    else:
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
        info["sms"] = torch.cuda.get_device_properties(0).multi_processor_count
    return info


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="results folder (bench/results/kernels_<hardware>_<date>)")
    p.add_argument("--quick", action="store_true", help="sixteen cases at ws 4, the op candidates only")
    p.add_argument("--dry-run", action="store_true", help="no GPU: the case list and every output, made-up times")
    p.add_argument("--kernels", default=",".join(KERNELS), help="comma-separated subset of " + ", ".join(KERNELS))
    p.add_argument("--ws", default="2,4,8", help="world sizes whose local shapes to measure")
    p.add_argument("--max-rows", type=int, default=None,
                   help="only the cases of at most this many local rows M (decode sizes: a sweep of their configs)")
    p.add_argument("--budget-s", type=float, default=300.0, help="start no case after this many seconds")
    p.add_argument("--jobs", type=int, default=max(1, min(15, (os.cpu_count() or 2) - 1)),
                   help="compile worker processes (0: compile while timing)")
    p.add_argument("--reps", type=int, default=30, help="timed repetitions per measurement (median)")
    p.add_argument("--no-variants", action="store_true", help="only the op's tuning candidates")
    p.add_argument("--list", action="store_true", help="print the case list and exit")
    p.add_argument("--rerender", action="store_true",
                   help="no GPU: write every output of --out again from its results.json (today's writers)")
    common.add_set_argument(p)  # (set in this process and in the compile workers)
    args = common.parse_args_with_sets(p, argv)
    args.kernels = tuple(k for k in args.kernels.split(",") if k)
    bad = [k for k in args.kernels if k not in KERNELS]
    if bad:
        p.error(f"--kernels: {bad} not among {KERNELS}")
    args.ws = tuple(int(w) for w in args.ws.split(","))
    if any(w not in WORLD_SIZES for w in args.ws):
        p.error(f"--ws: each of {WORLD_SIZES}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.time()
    todo = [(c, o) for c, o in cases(args.quick, args.kernels, args.ws)
            if args.max_rows is None or c.M <= args.max_rows]
    variants = not (args.no_variants or args.quick)
    if args.list:
        for case, origins in todo:
            print(case.label(), "|", "; ".join(origins))
        print(f"{len(todo)} cases, {len(compile_jobs(todo, variants))} kernel variants to compile")
        return 0
    out = Path(args.out)
    if args.rerender:
        done = json.loads((out / "results.json").read_text())
        write_outputs(out, done["rows"], done["info"], done["skipped"], done["compile"])
        print(f"rendered again: {len(done['rows'])} cases -> {out}")
        return 0
    info = run_info(args.dry_run, sys.argv[1:] if argv is None else list(argv))
    rows, skipped, compile_stats = [], [], {}
    if args.dry_run:
        rows = [fake_measure(c, o, variants) for c, o in todo]
        compile_stats = {"jobs": len(compile_jobs(todo, variants)), "workers": 0, "seconds": 0.0, "failed": []}
        write_outputs(out, rows, info, skipped, compile_stats)
        print(f"dry run: {len(rows)} cases -> {out}")
        return 0
    import triton

    from overlap_backend.codegen import epilogue as gen

    dev = torch.device("cuda")
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))
    num_sms = torch.cuda.get_device_properties(dev).multi_processor_count
    for spec in sorted({c.epilogue for c, _ in todo if c.kernel in ("ag_mm", "mm_rs")} | {""}):
        gen.build(spec, torch.bfloat16)  # written once here, before the workers import it
    print(f"{info['gpu']}, torch {info['torch']}, triton {info['triton']}: {len(todo)} cases", flush=True)
    compile_stats = precompile(todo, variants, args.jobs, start + 0.55 * args.budget_s, args.settings)
    print(f"compiled {compile_stats['done']}/{compile_stats['jobs']} variants in {compile_stats['seconds']:.0f} s "
          f"({len(compile_stats['failed'])} failed, {compile_stats['retried']} retried alone for memory)", flush=True)
    for i, (case, origins) in enumerate(todo):
        if time.time() - start > args.budget_s:
            skipped = [c.label() for c, _ in todo[i:]]
            break
        row = measure(case, origins, dev, num_sms, args.reps, variants, start + args.budget_s + 15)
        rows.append(row)
        # (a ratio is to the baseline calls beside the config's, not to the baseline's median over the case)
        print(f"{case.label()}: baseline {common.fmt_ms(row.get('baseline_ms'))} ms, op "
              f"{common.fmt_ms(row.get('op_ms'))} ({row.get('op_ratio', math.nan):.3f}x paired), best "
              f"{common.fmt_ms(row.get('best_ms'))} ({row.get('best_ratio', math.nan):.3f}x paired)"
              + (f" {row['error']}" if "error" in row else "")
              + (f" [{len(row['failed'])} failed]" if row.get("failed") else ""), flush=True)
        if i % 10 == 9:
            write_outputs(out, rows, info, [c.label() for c, _ in todo[i + 1:]], compile_stats)
    write_outputs(out, rows, info, skipped, compile_stats)
    print(f"{len(rows)} cases in {time.time() - start:.0f} s -> {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
