"""bench/suites/bench_kernels.py without a GPU: the case list, every output of a dry run (and that the
runtime reads its kernel_ratios.json), and each kernel's set-up, launch and float32 check under the
Triton interpreter at tiny sizes (float32: the interpreter's bfloat16 dot is not the GPU's)."""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bk():
    env = dict(os.environ)
    sys.path.insert(0, str(REPO))
    try:
        yield importlib.import_module("bench.suites.bench_kernels")
    finally:  # bench.tools.common sets NCCL variables
        os.environ.clear()
        os.environ.update(env)
        sys.path.remove(str(REPO))


@pytest.fixture
def moe(bk):
    """The MoE configs the cases and the set-ups read (``bench/suites/kernel_cases.py``)."""
    return importlib.import_module("bench.suites.kernel_cases").MOE


def test_cases_cover_every_kernel_and_world_size_once(bk):
    todo = bk.cases()
    assert len(todo) == len({c for c, _ in todo}), "deduplicated"
    assert {c.kernel for c, _ in todo} == set(bk.KERNELS)
    assert {c.ws for c, _ in todo} == {2, 4, 8}
    by = {c: o for c, o in todo}
    # TP block fc1 and Llama w1/w3 are one GEMM; mm_rs's K is split ws ways; mm_ar at 128 rows is one-shot
    assert by[bk.Case("ag_mm", 4, 8192, 4096, 3584)] == ["TP block fc1 / Llama w1, w3"]
    assert bk.Case("mm_rs", 4, 4096, 1792, 8192) in by and bk.Case("oneshot", 2, 128, 1, 8192) in by
    assert not any(c.kernel == "mm_ar" and c.M == 128 for c in by)
    assert [c.kernel for c, _ in todo][0] == "ag_mm" and todo[0][0].ws == 4, "what the ops decide on, 4 GPUs first"
    assert all(c.ws == 8 for c, _ in todo if c.moe == "deepseek-ep8")
    quick = bk.cases(quick=True)
    assert len(quick) == 16 and {c.kernel for c, _ in quick} == set(bk.KERNELS) and {c.ws for c, _ in quick} == {4}
    # every CTA stage case has its cuBLAS form beside it, at the same local GEMM; nothing of theirs compiles
    for stage in ("cta_stage0", "cta_stage1"):
        assert ({(c.ws, c.M, c.K, c.N, c.epilogue) for c, _ in todo if c.kernel == stage}
                == {(c.ws, c.M, c.K, c.N, c.epilogue) for c, _ in todo if c.kernel == stage + "_cublas"})
    # the collective GEMMs' cuBLAS forms at every plain shape of their kernels (mm_rs's fused one too)
    for kernel in ("ag_mm", "mm_rs", "mm_ar"):
        assert ({(c.ws, c.M, c.K, c.N, c.epilogue) for c, _ in todo if c.kernel == kernel and c.epilogue != "gelu"}
                == {(c.ws, c.M, c.K, c.N, c.epilogue) for c, _ in todo if c.kernel == kernel + "_cublas"})
    moe = lambda kernel: {(c.ws, c.M, c.moe) for c, _ in todo if c.kernel == kernel}  # noqa: E731
    assert moe("moe_grouped_mm") == moe("moe_gate_up") == moe("moe_down")
    assert not any(case.kernel in bk.CUBLAS_FORMS for _, case, _ in bk.compile_jobs(todo, variants=False))


def test_dry_run_writes_every_output_and_the_runtime_reads_the_ratios(bk, tmp_path):
    from overlap_backend.spec import kernel_ratios, knobs

    assert bk.main(["--out", str(tmp_path), "--dry-run", "--kernels", "ag_mm,mm_rs", "--ws", "4"]) == 0
    for name in ("table.md", "paths.md", "variants.md", "results.json", "kernel_ratios.json", "README.md",
                 "command.txt"):
        assert (tmp_path / name).stat().st_size > 0, name
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert {r["case"]["kernel"] for r in rows} == {"ag_mm", "mm_rs"}
    assert all(r["op_ratio"] > 0 and r["configs"] for r in rows)
    assert any(x["kind"] == "variant" for x in rows[0]["configs"])
    table = (tmp_path / "table.md").read_text()
    assert "--dry-run" in table and "TP block fc2 + residual" in table
    entries = json.loads((tmp_path / "kernel_ratios.json").read_text())["entries"]
    assert len(entries) == len(rows)
    gpu = entries[0]["gpu"]
    e = next(e for e in entries if e["kernel"] == "mm_rs" and not e["fused"])
    with knobs.symm.patch(KERNEL_RATIOS_FILE=str(tmp_path / "kernel_ratios.json")):
        # the op's candidates' best, or the variant it tunes over too where that won by MEASURED_VARIANT_GAIN
        with knobs.codegen.patch(MEASURED_VARIANT_GAIN=None):
            assert kernel_ratios.measured_ratio("mm_rs", e["M"], e["K"], e["N"], ws=4, gpu=gpu) == e["ratio"]
            assert kernel_ratios.measured_variant("mm_rs", e["M"], e["K"], e["N"], ws=4, gpu=gpu) is None
        won = e["best_variant_ratio"] <= e["ratio"] * (1 - knobs.codegen.MEASURED_VARIANT_GAIN)
        assert kernel_ratios.measured_ratio("mm_rs", e["M"], e["K"], e["N"], ws=4, gpu=gpu) == (
            e["best_variant_ratio"] if won else e["ratio"])
        assert kernel_ratios.measured_variant("mm_rs", e["M"], e["K"], e["N"], ws=4, gpu=gpu) == (
            tuple(e["best_config"]) if won else None)
    # the next fastest variants too, fastest first, each as its row timed it
    for e, r in zip(entries, rows):
        assert e["variants"] == [[c["config"], round(c["ratio"], 4)] for c in sorted(
            (c for c in r["configs"] if c["kind"] == "variant"), key=lambda c: c["ratio"])][:4]
    assert any(e["variants"] for e in entries)


def test_max_rows_keeps_only_the_cases_of_that_many_rows(bk, tmp_path):
    assert bk.main(["--out", str(tmp_path), "--dry-run", "--kernels", "cta_stage1,ag_mm", "--max-rows", "128"]) == 0
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert {r["case"]["M"] for r in rows} == {16, 128}  # the CTA decode sizes; ag_mm's fewest rows are 512
    assert {r["case"]["kernel"] for r in rows} == {"cta_stage1"}


def test_rerender_writes_the_outputs_again_from_the_results(bk, tmp_path):
    assert bk.main(["--out", str(tmp_path), "--dry-run", "--kernels", "ag_mm", "--ws", "2"]) == 0
    ratios = (tmp_path / "kernel_ratios.json").read_text()
    for name in ("table.md", "paths.md", "variants.md", "kernel_ratios.json"):
        (tmp_path / name).unlink()
    assert bk.main(["--out", str(tmp_path), "--rerender"]) == 0
    assert (tmp_path / "kernel_ratios.json").read_text() == ratios
    assert all((tmp_path / n).stat().st_size > 0 for n in ("table.md", "paths.md", "variants.md"))


def test_precompile_retries_alone_what_ran_out_of_memory_beside_the_others(bk, monkeypatch):
    todo = bk.cases(kernels=("moe_gate_up", "moe_down"), world_sizes=(4,))
    jobs = bk.compile_jobs(todo, variants=False)
    assert len(jobs) >= 3
    calls = []

    def pool(jobs_, indices, workers, deadline, settings=()):
        indices = list(indices)
        calls.append((indices, workers))
        if workers > 1:  # the first job runs out of memory, the second fails for good, the rest compile
            return {i: {0: "OutOfMemoryError: CUDA out of memory", 1: "ValueError: bad"}.get(i, "") for i in indices}
        return {i: "" for i in indices}  # alone, it fits

    monkeypatch.setattr(bk, "_compile_in_pool", pool)
    stats = bk.precompile(todo, variants=False, workers=4, deadline=float("inf"))
    assert calls == [(list(range(len(jobs))), 4), ([0], 1)]
    assert stats["done"] == len(jobs) and stats["retried"] == 1
    assert stats["failed"] == [f"{jobs[1][1].label()} {jobs[1][2]}: ValueError: bad"]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter runs where CUDA is absent")
def test_every_kernel_sets_up_runs_and_checks_under_the_interpreter(bk, moe, monkeypatch):
    import triton

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8))
    monkeypatch.setitem(moe, "tiny", (64, 128, 4, 2, 64))
    cases = [bk.Case("ag_mm", 2, 1024, 64, 256, "gelu"), bk.Case("mm_rs", 2, 1024, 64, 256, "add:0"),
             bk.Case("mm_ar", 2, 2048, 64, 256), bk.Case("oneshot", 2, 8, 1, 256),
             bk.Case("cta_stage0", 4, 16, 64, 512, "gelu_tanh"), bk.Case("cta_stage0", 2, 600, 64, 512, "gelu_tanh"),
             bk.Case("cta_stage1", 4, 16, 512, 256),
             bk.Case("moe_gate_up", 2, 128, 64, 128, "swiglu", "tiny"), bk.Case("moe_down", 2, 128, 64, 128, "", "tiny")]
    for case in cases:
        cta = case.kernel.startswith("cta_")
        b = bk.Bench(case, torch.device("cpu"), 16 if cta else 4, 1, torch.float32)
        if cta:  # every config: split-K runs (16 SMs: few tiles) and not, stage 0's narrower tiles, its stream-K forms
            cfgs = b.op_cands + b.variant_cands
            at = 7 if case.kernel == "cta_stage0" else 6  # (the split-K runs' field)
            split = b.op_cands[0][at]
            assert (split > 1) == (case.M == 16) and any(cfg[at] == 1 for cfg in cfgs), cfgs
            if case.kernel == "cta_stage0":
                assert [cfg[8] for cfg in cfgs if len(cfg) > 8] == ["stream_k" if split > 1 else "stream_k_tail"]
            cfgs = [cfg for cfg in cfgs if not isinstance(cfg[6], str)]  # (the Gluon forms run on a GPU only)
        else:
            cfgs = [next((c for c in b.op_cands if c is not None and c[6]), b.op_cands[0])]  # a TMA store if any
        for cfg in cfgs:
            assert b.check(cfg) <= 1e-5, (case.label(), cfg)
        _check_with_sum(b, case.kernel in ("mm_rs", "mm_ar"))
        assert (b.run_apart is not None) == (case.kernel == "ag_mm")  # the fused ag_mm: its epilogue apart too
        if b.run_apart is not None:
            assert b.apart_error(cfgs[0]) <= 1e-5 and not torch.isnan(b.apart_out).any()


def test_every_kernel_benches_its_gluon_forms_in_16_bits(bk, moe, monkeypatch):
    """The warp-specialized Gluon forms of knobs.codegen.VARIANTS_16BIT are among each 16-bit case's bench variants
    (set up only, on the CPU: a table entry that the case's filters drop is never measured, so never installed)."""
    from overlap_backend.codegen import configs
    from overlap_backend.spec import knobs

    monkeypatch.setitem(moe, "tiny", (64, 128, 4, 2, 64))
    for case in (bk.Case("moe_down", 2, 256, 128, 256, "", "tiny"), bk.Case("mm_rs", 2, 1024, 64, 256),
                 bk.Case("ag_mm", 2, 1024, 64, 256)):
        kernel = case.kernel
        forms = {tuple(c) for c in knobs.codegen.VARIANTS_16BIT[kernel] if c[6] in configs.GLUON_STORES}
        assert forms, kernel
        b = bk.Bench(case, torch.device("cpu"), 4, 1, torch.bfloat16)
        assert forms <= set(b.variant_cands) | set(b.op_cands), (kernel, forms, b.variant_cands)


def _check_with_sum(b, expected: bool) -> None:
    """The second baseline of mm_rs / mm_ar rows: cuBLAS, then the sum of this rank's ws partials (none elsewhere)."""
    if not expected:
        assert b.with_sum is None
        return
    b.summed.fill_(float("nan"))
    b.with_sum[1]()
    parts, dim = b.sum_of
    assert parts.shape[dim] == b.case.ws and b.summed.shape[-1] == b.case.N
    torch.testing.assert_close(b.summed, parts.sum(dim))


def test_measure_takes_each_configs_ratio_to_the_baseline_beside_it(bk, moe, monkeypatch):
    """Each config is timed call by call against cuBLAS (``time_paired``): its ratio is the paired one, not its
    time over a baseline timed at another moment, and the op's config is the one of the lowest ratio."""
    import triton

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8))
    monkeypatch.setitem(moe, "tiny", (64, 128, 4, 2, 64))
    case = bk.Case("moe_down", 2, 128, 64, 128, "", "tiny")
    QT, PT = bk.common.QueuedTime, bk.common.PairedTime
    # the baseline alone (one call waited on the GPU), then two configs: the first faster in ms at a faster
    # clock (its baseline 0.2 ms), the second slower in ms but faster than the baseline beside it
    monkeypatch.setattr(bk.Bench, "time", lambda self, fn: QT(0.4, 9.0, False))
    paired = iter([PT(0.3, 0.2, 1.5, 60.0, True), PT(0.35, 0.4, 0.875, 50.0, True)])
    monkeypatch.setattr(bk.Bench, "time_paired", lambda self, fn: next(paired))
    monkeypatch.setattr(bk.Bench, "back_to_back_ms", lambda self, fn: 0.5)
    init = bk.Bench.__init__
    monkeypatch.setattr(bk.Bench, "__init__", lambda self, c, dev, sms, reps: init(self, c, dev, sms, reps, torch.float32))
    from overlap_backend.spec import knobs

    with knobs.codegen.patch(MOE_DOWN_16BIT=knobs.codegen.MOE_DOWN_16BIT[:1] * 2):  # the one config, twice
        row = bk.measure(case, ["MoE tiny"], torch.device("cpu"), 4, 1, variants=False)
    assert "error" not in row and len(row["configs"]) == 2, row
    assert row["baseline_ms_runs"] == [0.2, 0.4] and row["baseline_ms"] == pytest.approx(0.3)
    assert row["baseline_alone_ms"] == 0.4
    assert [r["ratio"] for r in row["configs"]] == [1.5, 0.875]
    assert row["op_ms"] == 0.35 and row["op_ratio"] == 0.875 and row["op_host_us"] == 50.0
    assert row["baseline_host_us"] == 9.0
    assert row["all_queued"] is False and row["back_to_back_ms"] == {"baseline": 0.5, "op": 0.5}
    assert bk._back_to_back(row) == "1.000 †"


@pytest.mark.parametrize("case", [("cta_stage0_cublas", 4, 16, 64, 512, "gelu_tanh"), ("cta_stage1_cublas", 4, 16, 512, 256),
                                  ("cta_stage0_cublas", 2, 300, 64, 1024, "gelu_tanh"),
                                  ("cta_stage1_cublas", 8, 300, 1024, 128),
                                  ("moe_grouped_mm", 2, 128, 64, 128, "swiglu", "tiny"),
                                  ("moe_grouped_mm", 4, 120, 64, 128, "swiglu", "tiny-skewed"),
                                  ("moe_grouped_mm", 4, 2048, 64, 128, "swiglu", "tiny-phased")],
                         ids=lambda c: f"{c[0]}-ws{c[1]}-M{c[2]}" + (f"-{c[6]}" if len(c) > 6 else ""))
def test_cublas_forms_write_every_row_the_kernels_write(bk, moe, case, monkeypatch):
    """The cuBLAS forms run the op's own steps (runtime/cta_cublas.py on the Triton stage's chunk plan;
    runtime/moe_grouped.py per segment, CPU's torch._grouped_mm); the check poisons their output first, so a
    block or row left unwritten fails it. Several CTA row groups at M = 300; MoE with 4 and 8 experts, one
    segment (expert-major) and one per source."""
    monkeypatch.setitem(moe, "tiny", (64, 128, 4, 2, 64))
    monkeypatch.setitem(moe, "tiny-skewed", (64, 128, 8, 3, 40))
    monkeypatch.setitem(moe, "tiny-phased", (64, 128, 8, 2, 1024))  # a segment per source (not expert-major)
    b = bk.Bench(bk.Case(*case), torch.device("cpu"), 4, 1, torch.float32)
    assert b.op_cands == [None]
    assert b.check(None) <= 1e-5
    b.outputs[0].fill_(float("nan"))  # and the check sees what it is given
    assert not b.error() <= 1e-5


@pytest.mark.parametrize("case", [("ag_mm_cublas", 2, 256, 64, 128), ("ag_mm_cublas", 4, 256, 64, 96),
                                  ("mm_rs_cublas", 2, 256, 64, 128), ("mm_rs_cublas", 4, 512, 32, 96),
                                  ("mm_rs_cublas", 2, 256, 64, 128, "add:0"),
                                  ("mm_ar_cublas", 2, 256, 64, 128), ("mm_ar_cublas", 4, 300, 64, 96)],
                         ids=lambda c: f"{c[0]}-ws{c[1]}-M{c[2]}" + (f"-{c[5]}" if len(c) > 5 else ""))
def test_collective_cublas_forms_run_the_ops_code_alone(bk, case, monkeypatch):
    """``*_cublas`` rows run runtime/symm's cuBLAS paths themselves on ``AloneGroup`` (rank 0, every flag raised,
    no pushes; the stream memory operations are no-ops on the CPU, which has no streams): this rank's result
    matches the float32 reference, and with the form's GEMMs and sums skipped the check fails (the rows it
    writes read NaN: poisoned outputs, and new tensors NaN-filled here as ``check``'s freed NaN blocks make
    them under the GPU's caching allocator)."""
    from overlap_backend.runtime import cuda as _cuda
    from overlap_backend.runtime.symm import ag_mm as symm_ag_mm
    from overlap_backend.runtime.symm import mm_ar as symm_mm_ar
    from overlap_backend.runtime.symm import mm_rs as symm_mm_rs

    class HostStream:
        def wait_stream(self, other):
            pass

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: HostStream())
    for name in ("write_value32", "wait_value32", "memcpy_async"):
        monkeypatch.setattr(_cuda, name, lambda *args: None)
    b = bk.Bench(bk.Case(*case), torch.device("cpu"), 4, 1, torch.float32)
    assert b.op_cands == [None] and b.variant_cands == []
    assert b.check(None) <= 1e-5
    _check_with_sum(b, case[0] != "ag_mm_cublas")
    assert bool(b.outputs) != bool(b.fresh_outputs)  # poisoned in place, or a new tensor of the form's
    skip = lambda *args, **kwargs: None  # noqa: E731
    for module in (symm_ag_mm, symm_mm_rs, symm_mm_ar):
        for name in ("matmul_into", "reduce_slots", "reduce_own"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, skip)
    new_empty = torch.Tensor.new_empty
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda self, *a, **k: new_empty(self, *a, **k).fill_(float("nan")))
    assert not b.check(None) <= 1e-5


def test_paths_take_the_runtimes_choice_and_read_the_chosen_paths_ratio(bk, tmp_path):
    """kernel_paths: at each shape, the path the runtime's choice functions take on the run's own ratios, and
    that path's ratio; a cuBLAS path measured slower than its losing kernel leaves the op on the kernel."""
    from overlap_backend.spec import kernel_ratios

    paths = importlib.import_module("bench.suites.kernel_paths")
    gpu = "Test GPU"

    def row(kernel, ws, M, K, N, ratio, epilogue="", moe=""):
        return {"case": {"kernel": kernel, "ws": ws, "M": M, "K": K, "N": N, "epilogue": epilogue, "moe": moe},
                "op_ratio": ratio, "op_ms": ratio}

    rows = [row("mm_rs", 4, 4096, 1792, 8192, 1.3), row("mm_rs_cublas", 4, 4096, 1792, 8192, 1.02),
            row("mm_rs", 4, 4096, 1792, 8192, 1.25, "add:0"), row("mm_rs_cublas", 4, 4096, 1792, 8192, 1.08, "add:0"),
            row("ag_mm", 4, 8192, 4096, 3584, 1.2, "gelu"), row("ag_mm_cublas", 4, 8192, 4096, 3584, 1.01),
            row("mm_rs", 4, 16384, 512, 8192, 1.3), row("mm_rs_cublas", 4, 16384, 512, 8192, 1.4),
            row("mm_ar", 4, 4096, 7168, 8192, 1.2),  # its cuBLAS path not measured
            row("oneshot", 4, 128, 1, 8192, 0.8), row("oneshot", 2, 128, 1, 8192, 1.7),
            row("cta_stage1", 2, 1024, 28672, 8192, 1.2), row("cta_stage1_cublas", 2, 1024, 28672, 8192, 1.1),
            row("moe_gate_up", 4, 8192, 7168, 2048, 1.3, "swiglu", "ds"), row("moe_down", 4, 8192, 2048, 7168, 1.4, "", "ds"),
            row("moe_grouped_mm", 4, 8192, 7168, 2048, 1.1, "swiglu", "ds")]
    entries = [{"gpu": gpu, "kernel": r["case"]["kernel"], "dtype": "bfloat16", "ws": r["case"]["ws"],
                "M": r["case"]["M"], "K": r["case"]["K"], "N": r["case"]["N"], "fused": bool(r["case"]["epilogue"]),
                "ratio": r["op_ratio"]} for r in rows]
    rows[0]["op_ratio_with_sum"], rows[1]["op_ratio_with_sum"], rows[6]["op_ratio_with_sum"] = 1.1, 0.9, 1.05
    rows[2]["op_ratio_with_sum"], rows[3]["op_ratio_with_sum"] = 1.15, 0.95
    (tmp_path / "kernel_ratios.json").write_text(json.dumps(kernel_ratios.document(entries)))
    from overlap_backend.spec import knobs

    by_default = paths.paths(rows, tmp_path / "kernel_ratios.json", gpu)
    with knobs.cta.patch(STAGE0_GEMM="triton", STAGE1_GEMM="triton"), knobs.moe.patch(EXPERT_GEMM="triton"):
        found = paths.paths(rows, tmp_path / "kernel_ratios.json", gpu)  # "path": the forms' knobs as set here
    assert [(e["path"], e["path_ratio"]) for e in by_default] == [(e["auto"], e["auto_ratio"]) for e in found], \
        "the CTA and MoE forms' knobs are auto by default"
    fused = {e["case"]["kernel"]: e for e in found if e["case"]["epilogue"] in ("add:0", "gelu")}
    got = {(e["case"]["kernel"], e["case"]["ws"], e["case"]["M"]): e for e in found if e not in fused.values()}
    assert len(found) == 10 and len(got) == 8, "a row per kernel case, none for the paths' own rows"
    # a fused case reads its own cuBLAS path's row, and the plain one's where only that was measured
    assert fused["mm_rs"]["other_ratio"] == 1.08 and fused["mm_rs"]["path_ratio_with_sum"] == 0.95
    assert fused["ag_mm"]["other_ratio"] == 1.01
    # the MoE layer's grouped form (over both GEMMs) stands for the down GEMM too, keyed by gate/up's shape
    assert got["moe_down", 4, 8192]["other_ratio"] == got["moe_gate_up", 4, 8192]["other_ratio"] == 1.1
    assert (got["mm_rs", 4, 4096]["path"], got["mm_rs", 4, 4096]["path_ratio"]) == ("other", 1.02)
    assert (got["mm_rs", 4, 16384]["path"], got["mm_rs", 4, 16384]["path_ratio"]) == ("kernel", 1.3)
    assert got["mm_rs", 4, 4096]["path_ratio_with_sum"] == 0.9 and got["mm_rs", 4, 16384]["path_ratio_with_sum"] == 1.05
    assert got["mm_ar", 4, 4096]["path_ratio_with_sum"] is None and "path_ratio_with_sum" not in got["oneshot", 4, 128]
    assert got["mm_ar", 4, 4096]["path"] == "other" and got["mm_ar", 4, 4096]["path_ratio"] is None
    assert (got["oneshot", 4, 128]["path"], got["oneshot", 4, 128]["path_ratio"]) == ("kernel", 0.8)
    assert (got["oneshot", 2, 128]["path"], got["oneshot", 2, 128]["path_ratio"]) == ("other", 1.0)
    stage1 = got["cta_stage1", 2, 1024]
    assert (stage1["path"], stage1["path_ratio"], stage1["auto"], stage1["auto_ratio"]) == ("kernel", 1.2, "other", 1.1)
    text = paths.markdown(list(got.values()), gpu, "here")
    assert "| mm_rs_cublas " in text and "1.300 **>1.03**" in text and "torch.sum" in text
    assert "with auto forms" in text and "with auto forms" not in paths.markdown(by_default, gpu, "here"), \
        "the auto columns only where the knobs as set chose otherwise"
    summary = {r[0]: r for r in paths.summary(list(got.values()))}
    assert summary["mm_rs"][1:4] == [2, 1, 0] and summary["mm_ar"][1:4] == [1, 0, 1] and summary["oneshot"][2] == 2
    assert {r[0]: r[1:4] for r in paths.summary(list(got.values()), "path_ratio_with_sum")} == {
        "mm_rs": [2, 1, 0], "mm_ar": [1, 0, 1]}
    assert kernel_ratios.entries(tmp_path / "kernel_ratios.json"), "the run's file is left as it was"


def test_paths_take_the_epilogue_apart_where_it_measured_faster(bk, tmp_path):
    """A fused ag_mm case on its kernel: the path is the kernel with its epilogue apart where ``apart_ratio``
    measured faster than fused by the gain, its ratio that one; fused otherwise."""
    from overlap_backend.spec import kernel_ratios

    paths = importlib.import_module("bench.suites.kernel_paths")
    gpu = "Test GPU"
    rows = [{"case": {"kernel": "ag_mm", "ws": 4, "M": M, "K": 4096, "N": N, "epilogue": "gelu", "moe": ""},
             "op_ratio": 1.02, "op_ms": 1.0, "apart_ratio": apart} for M, N, apart in
            ((8192, 3584, 0.99), (8192, 28672, 1.015))]
    entries = [{"gpu": gpu, "kernel": "ag_mm", "dtype": "bfloat16", "ws": 4, "M": r["case"]["M"], "K": 4096,
                "N": r["case"]["N"], "fused": True, "ratio": r["op_ratio"], "apart_ratio": r["apart_ratio"]}
               for r in rows]
    (tmp_path / "kernel_ratios.json").write_text(json.dumps(kernel_ratios.document(entries)))
    found = paths.paths(rows, tmp_path / "kernel_ratios.json", gpu)
    assert [(e["path"], e["path_ratio"]) for e in found] == [("apart", 0.99), ("kernel", 1.02)]
    assert "ag_mm, epilogue apart" in paths.markdown(found, gpu, "here")


def test_paths_read_the_variant_the_op_tunes_over_too(bk, tmp_path):
    """Where a run's best bench-only variant of ag_mm / mm_rs / mm_ar beat the op's candidates by
    MEASURED_VARIANT_GAIN, the op tunes over it too: its path's ratio is the variant's (and so is the choice)."""
    from overlap_backend.spec import kernel_ratios, knobs

    paths = importlib.import_module("bench.suites.kernel_paths")
    gpu = "Test GPU"
    case = {"kernel": "mm_ar", "ws": 4, "M": 4096, "K": 7168, "N": 8192, "epilogue": "", "moe": ""}
    variant = {"kind": "variant", "config": [128, 256, 64, 4, 3, 8, False], "ratio": 1.02, "ms": 1.02}
    rows = [{"case": case, "op_ratio": 1.2, "op_ms": 1.2, "op_ratio_with_sum": 1.1, "best_ratio": 1.02,
             "best_ms": 1.02, "best_kind": "variant", "best_config": [128, 256, 64, 4, 3, 8, False],
             "configs": [{"kind": "op", "config": [128, 256, 64, 8, 3, 8, False], "ratio": 1.2, "ms": 1.2}, variant]},
            {"case": {**case, "kernel": "mm_ar_cublas"}, "op_ratio": 1.1, "op_ms": 1.1}]
    entries = [{"gpu": gpu, "kernel": "mm_ar", "dtype": "bfloat16", "ws": 4, "M": 4096, "K": 7168, "N": 8192,
                "fused": False, "ratio": 1.2, "best_variant_ratio": 1.02, "best_config": [128, 256, 64, 4, 3, 8, False]},
               {"gpu": gpu, "kernel": "mm_ar_cublas", "dtype": "bfloat16", "ws": 4, "M": 4096, "K": 7168, "N": 8192,
                "fused": False, "ratio": 1.1}]
    (tmp_path / "kernel_ratios.json").write_text(json.dumps(kernel_ratios.document(entries)))
    (e,) = paths.paths(rows, tmp_path / "kernel_ratios.json", gpu)
    assert (e["kernel_ratio"], e["path"], e["path_ratio"]) == (1.02, "kernel", 1.02)
    assert abs(e["path_ratio_with_sum"] - 1.1 * 1.02 / 1.2) < 1e-12
    with knobs.codegen.patch(MEASURED_VARIANT_GAIN=None):
        (e,) = paths.paths(rows, tmp_path / "kernel_ratios.json", gpu)
    assert (e["kernel_ratio"], e["path"], e["path_ratio"]) == (1.2, "other", 1.1)


def test_measure_times_the_baseline_with_the_reduce_scatters_sum(bk, monkeypatch):
    """mm_rs / mm_ar rows are also timed against the baseline followed by the sum of this rank's ws partials
    (what the unfused collective sums): ``op_ratio_with_sum``, beside ``op_ratio``, and in the ratio file."""
    case = bk.Case("mm_rs", 2, 256, 64, 128)
    QT, PT = bk.common.QueuedTime, bk.common.PairedTime
    monkeypatch.setattr(bk.Bench, "time", lambda self, fn: QT(0.4, 9.0, True))
    # the baseline + sum (1.25x the baseline beside it), then every config at 1.2x
    paired = iter([PT(0.5, 0.4, 1.25, 9.0, True)] + [PT(0.48, 0.4, 1.2, 20.0, True)] * 20)
    monkeypatch.setattr(bk.Bench, "time_paired", lambda self, fn: next(paired))
    monkeypatch.setattr(bk.Bench, "back_to_back_ms", lambda self, fn: 0.5)
    monkeypatch.setattr(bk.Bench, "check", lambda self, cfg: 0.0)
    monkeypatch.setattr(bk, "_first_error", lambda fn, dev: None)
    init = bk.Bench.__init__
    monkeypatch.setattr(bk.Bench, "__init__", lambda self, c, dev, sms, reps: init(self, c, dev, sms, reps, torch.float32))
    row = bk.measure(case, ["collective mm_rs"], torch.device("cpu"), 4, 1, variants=False)
    assert "error" not in row and row["with_sum_ms"] == 0.5 and "torch.sum" in row["with_sum"]
    assert row["op_ratio"] == pytest.approx(1.2) and row["op_ratio_with_sum"] == pytest.approx(0.96)
    entry = bk.ratio_entries([row], {"gpu": "G"}, "here")[0]
    assert entry["ratio"] == pytest.approx(1.2) and entry["ratio_with_sum"] == pytest.approx(0.96)
    assert "| 0.960 " in bk.table_markdown([row], bk.run_info(True, ["--dry-run"]), [])


def test_measure_times_the_fused_ag_mm_with_its_epilogue_apart_too(bk, monkeypatch):
    """A fused ag_mm row also times the op's best config plain with the epilogue's torch step after it, over the
    same baseline (``apart_ratio``): in the ratio file, the table and the op's path where it wins."""
    case = bk.Case("ag_mm", 2, 1024, 64, 256, "gelu")
    QT, PT = bk.common.QueuedTime, bk.common.PairedTime
    monkeypatch.setattr(bk.Bench, "time", lambda self, fn: QT(0.4, 9.0, True))
    init = bk.Bench.__init__
    n = len(bk.Bench(case, torch.device("cpu"), 4, 1, torch.float32).op_cands)
    paired = iter([PT(0.45, 0.4, 1.12, 20.0, True)] * n + [PT(0.42, 0.4, 1.05, 20.0, True)])
    monkeypatch.setattr(bk.Bench, "time_paired", lambda self, fn: next(paired))
    monkeypatch.setattr(bk.Bench, "back_to_back_ms", lambda self, fn: 0.5)
    monkeypatch.setattr(bk.Bench, "check", lambda self, cfg: 0.0)
    monkeypatch.setattr(bk, "_first_error", lambda fn, dev: None)

    def cpu_init(self, c, dev, sms, reps):
        init(self, c, dev, sms, reps, torch.float32)
        self.apart_error = lambda cfg: 0.0

    monkeypatch.setattr(bk.Bench, "__init__", cpu_init)
    row = bk.measure(case, ["collective ag_mm"], torch.device("cpu"), 4, 1, variants=False)
    assert "error" not in row and row["op_ratio"] == pytest.approx(1.12) and row["apart_ratio"] == pytest.approx(1.05)
    entry = bk.ratio_entries([row], {"gpu": "G"}, "here")[0]
    assert entry["apart_ratio"] == pytest.approx(1.05) and entry["fused"]
    assert "1.050 **>1.03**" in bk.table_markdown([row], bk.run_info(True, ["--dry-run"]), [])
    # a config whose apart path is wrong: reported, not timed
    paired = iter([PT(0.45, 0.4, 1.12, 20.0, True)] * n)

    def wrong_init(self, c, dev, sms, reps):
        init(self, c, dev, sms, reps, torch.float32)
        self.apart_error = lambda cfg: 0.5

    monkeypatch.setattr(bk.Bench, "__init__", wrong_init)
    row = bk.measure(case, ["collective ag_mm"], torch.device("cpu"), 4, 1, variants=False)
    assert "apart_ratio" not in row and row["apart_error"].startswith("WRONG")


@pytest.mark.parametrize("rank", [0, 1, 3])
def test_ag_mm_cublas_merges_short_chunks_into_a_gemm_per_contiguous_range(bk, rank, monkeypatch):
    """``knobs.symm.AG_CUBLAS_MERGE_ROWS``: chunks shorter than it are computed, after the own one, by one GEMM per
    contiguous range of the peers' slots (after this rank's, then before it) once all arrived, not one per chunk:
    the same rows as the per-chunk path, in fewer weight reads; longer chunks keep a GEMM each."""
    from overlap_backend.runtime import cuda as _cuda
    from overlap_backend.runtime.symm import ag_mm as symm_ag_mm
    from overlap_backend.spec import knobs

    setups = importlib.import_module("bench.suites.kernel_setups")
    monkeypatch.setattr(_cuda, "wait_value32", lambda *args: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    ws, run, K, N = 4, 8, 16, 12
    st = setups.AloneGroup(ws, torch.device("cpu"))
    monkeypatch.setattr(st, "rank", rank, raising=False)
    buf = torch.randn(ws, run, K)
    shard = buf[rank].clone()
    buf[rank].fill_(float("nan"))  # the own rows come from the shard, never from its slot
    w, bias = torch.randn(K, N), torch.randn(N)
    want = torch.cat([shard if c == rank else buf[c] for c in range(ws)]) @ w + bias
    calls = []
    real = symm_ag_mm.matmul_into
    monkeypatch.setattr(symm_ag_mm, "matmul_into", lambda a, *rest: (calls.append(a.shape[0]), real(a, *rest)))
    for merge_rows, gemms in ((0, [run] * ws), (run + 1, [run] + [n * run for n in (ws - 1 - rank, rank) if n])):
        calls.clear()
        out = torch.full((ws * run, N), float("nan"))
        with knobs.symm.patch(AG_CUBLAS_MERGE_ROWS=merge_rows):
            symm_ag_mm.ag_mm_cublas(st, shard, buf, [w], [bias], [out], 1, run, st.EPOCH, st.base, 1, None)
        torch.testing.assert_close(out, want)
        assert calls == gemms, (merge_rows, calls)


def test_set_applies_a_knob_for_the_run_and_records_it(bk, tmp_path):
    from overlap_backend.spec import knobs

    with knobs.symm.patch(AG_CUBLAS_MERGE_ROWS=0):  # (restored after the run's --set)
        assert bk.main(["--out", str(tmp_path), "--dry-run", "--kernels", "ag_mm_cublas", "--ws", "8",
                        "--set", "symm.AG_CUBLAS_MERGE_ROWS=256"]) == 0
        assert knobs.symm.AG_CUBLAS_MERGE_ROWS == 256
    assert "--set symm.AG_CUBLAS_MERGE_ROWS=256" in (tmp_path / "command.txt").read_text()
    with pytest.raises(SystemExit):
        bk.parse_args(["--out", str(tmp_path), "--set", "symm.NO_SUCH_KNOB=1"])


def test_variants_table_compares_configs_through_their_ratios_to_the_baseline_beside_them(bk):
    """A variant whose time is longer than the op's best, but taken while the clock ran slower (its baseline beside
    it longer too), beat the op: the table must read the ratios, as ``summarize`` does, not the raw times."""
    op = {"kind": "op", "config": [128, 256, 64, 8, 3, 8, True], "ms": 0.412, "ratio": 1.283}
    variant = {"kind": "variant", "config": [128, 128, 64, 8, 4, 4, "ws_pingpong_direct"], "ms": 0.422,
               "ratio": 1.252}
    slower = {"kind": "variant", "config": [64, 256, 64, 8, 4, 8, False], "ms": 0.400, "ratio": 1.400}
    row = {"case": {"kernel": "mm_rs"}, "configs": [op, variant, slower]}
    bk.summarize(row)
    assert row["best_config"] == variant["config"]
    lines = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
             for line in bk.variants_markdown([row]).splitlines() if line.startswith("| mm_rs")}
    won = lines["mm_rs 128x128x64 g8 s4 w4 ws_pingpong_direct"]
    lost = lines["mm_rs 64x256x64 g8 s4 w8"]
    assert won[2] == "1" and float(won[3]) == pytest.approx(1.252 / 1.283, abs=1e-3)
    assert lost[2] == "0" and float(lost[3]) == pytest.approx(1.400 / 1.283, abs=1e-3)
