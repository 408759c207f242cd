"""CPU checks that every benchmark and ``bench/run_device.sh`` take 2, 4 and 8 GPUs.

Nothing heavy runs: the benchmarks' argument parsing and the functions that derive their shapes,
configs and variants from the world size; ``run_device.sh`` under a fake ``nvidia-smi`` (N GPUs) and a
fake ``timeout`` that records each stage's command instead of running it, so the stages, their order
and their arguments are checked for 2, 4 and 8 GPUs (2 and 4: exactly what the script ran before 8
GPUs were added).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
WORLD_SIZES = (2, 4, 8)


@pytest.fixture(scope="module")
def bench():
    """The benchmark modules, imported as ``bench.<name>`` (no process group, no GPU)."""
    symm_log = logging.getLogger("overlap_backend.symm")
    level, handlers = symm_log.level, list(symm_log.handlers)
    env = dict(os.environ)
    sys.path.insert(0, str(REPO))
    try:
        mods = {n.rpartition(".")[2]: importlib.import_module(f"bench.{n}")
                for n in ("tools.common", "suites.bench_collective_gemm", "suites.bench_moe", "suites.bench_cta",
                          "suites.bench_block", "suites.bench_epilogue", "probes.probe_host")}
        yield mods
    finally:  # bench_collective_gemm adds a log handler, bench.common sets NCCL variables
        symm_log.setLevel(level)
        symm_log.handlers[:] = handlers
        os.environ.clear()
        os.environ.update(env)
        sys.path.remove(str(REPO))


# ------------------------------------------------------------------------- collective benchmark
@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_collective_shapes_split_evenly(bench, ws):
    from overlap_backend.runtime.symm.lowering_helpers import tma_problem

    b = bench["bench_collective_gemm"]
    rows = b.list_shapes(ws)
    for suite in b.SUITES:  # every suite keeps every row at 2, 4 and 8 ranks (none dropped as indivisible)
        mine = [r for r in rows if r["suite"] == suite]
        want = 5 if (suite, ws) == ("ag_mm", 2) else 4  # ws=2: the baseline tables' own ag_mm row on top
        assert len(mine) == want, (suite, ws, mine)
    for r in rows:
        for d in b.SPLIT[r["suite"]]:
            assert r[d] % ws == 0, r
        # the per-rank operands: bf16 rows of 16 bytes (TMA), whole 64-wide K tiles of the split K
        A, B, out = r["A"], r["B"], r["out"]
        assert A[1] == B[0] and out[1] == B[1], r
        assert tma_problem(torch.bfloat16, A[1], B[1]) is None, r
        if r["suite"] == "mm_rs":
            assert A[1] == r["K"] // ws and A[1] % 64 == 0 and out[0] * ws == r["M"], r
        if r["suite"] == "ag_mm":
            assert A[0] * ws == r["M"] and out[0] == r["M"], r
        if r["suite"] == "mm_ar":
            assert (A, B) == ((r["M"], r["K"]), (r["K"], r["N"])), r  # per-rank sizes, as in the baseline tables
    # the CPU smoke test's shapes split too
    for r in b.list_shapes(ws, cpu=True):
        assert all(r[d] % ws == 0 for d in b.SPLIT[r["suite"]]), r


def test_collective_shapes_at_8_are_the_design_problems(bench):
    b = bench["bench_collective_gemm"]
    got = {(r["suite"], r["M"], r["K"], r["N"], r["origin"]) for r in b.list_shapes(8)}
    assert ("ag_mm", 4096, 8192, 7168, "adapted from ws=4") in got
    assert ("mm_rs", 16384, 2048, 8192, "adapted from ws=4") in got  # K split 8 ways: 256 per rank
    assert ("mm_ar", 8192, 7168, 8192, "DESIGN ws=4, per-rank sizes") in got
    # ws=4 keeps its DESIGN rows, ws=2 its own ag_mm row
    assert ("ag_mm", 4096, 8192, 7168, "DESIGN ws=4") in {(r["suite"], r["M"], r["K"], r["N"], r["origin"])
                                                         for r in b.list_shapes(4)}
    assert any(r["origin"] == "DESIGN ws=2" for r in b.list_shapes(2))


def test_collective_cli(bench, capsys):
    b = bench["bench_collective_gemm"]
    args = b.parse_args(["--suite", "mm_rs", "--lowerings", "symm", "--quick", "--list-shapes", "8"])
    assert args.suites == ["mm_rs"] and args.lowerings == ["symm"] and args.list_shapes == 8
    assert b.main(["--list-shapes", "8"]) == 0
    out = capsys.readouterr().out
    assert "world size 8" in out and "4096×896" in out  # mm_rs: A [M, K/8] per rank


def test_collective_variants_are_timed_again_in_interleaved_rounds(bench):
    """Runner.interleave: after each variant was timed once, ``--rounds`` more rounds over the variants that
    timed (A, B, A, B, ...); a variant's time is the median of its timings, n/a ones are not timed again."""
    b = bench["bench_collective_gemm"]
    calls = []
    script = {"mm": [1.0, 5.0, 2.0], "ours": [9.0, 3.0, 4.0]}

    class FakeTiming:
        def bench(self, fn):
            fn()
            calls.append(fn.__name__)
            return script[fn.__name__][calls.count(fn.__name__) - 1], 10

    def mm():
        pass

    def ours():
        pass

    def broken():
        raise RuntimeError("this torch has no such op")

    r = b.Runner(FakeTiming(), verbose=False)
    r.run("mm", mm)
    r.run("torch_fused", broken)
    r.run("ours", ours)
    r.interleave(2)
    assert calls == ["mm", "ours", "mm", "ours", "mm", "ours"]
    assert r.times == {"mm": 2.0, "torch_fused": None, "ours": 4.0} and r.reps == {"mm": 30, "ours": 30}
    assert r.round_ms == {"mm": [1.0, 5.0, 2.0], "ours": [9.0, 3.0, 4.0]}
    assert r.notes["torch_fused"] == "n/a: RuntimeError: this torch has no such op"
    assert b.parse_args(["--out-dir", "x"]).rounds == 2
    with pytest.raises(SystemExit):
        b.parse_args(["--out-dir", "x", "--rounds", "-1"])


# ----------------------------------------------------------------------------------- MoE
def test_moe_configs(bench):
    m = bench["bench_moe"]
    assert m.CONFIGS["deepseek-ep8"] == (7168, 2048, 64, 8, 4096)
    assert m.default_configs(8)[0] == "deepseek-ep8"
    assert "deepseek-ep8" not in m.default_configs(4) and "deepseek-ep8" not in m.default_configs(2)
    for ws in WORLD_SIZES:
        for cfg in m.default_configs(ws) + ["deepseek-ep8"]:
            d = m.describe(cfg, ws)
            assert d["problem"] is None and d["experts_per_rank"] * ws == d["experts"], d
    assert m.describe("deepseek-ep8", 8)["experts_per_rank"] == 8
    assert "do not split over 3 ranks" in m.config_problem("mixtral", 3)
    args = m.parse_args(["--out", "/tmp/x", "--configs", "deepseek-ep8,deepseek", "--routing", "balanced",
                         "--comm-sms", "8"])
    assert args.configs == ["deepseek-ep8", "deepseek"] and args.comm_sms == [8]
    assert m.parse_args(["--out", "/tmp/x"]).configs is None  # resolved per world size in main
    with pytest.raises(SystemExit):
        m.parse_args(["--out", "/tmp/x", "--configs", "nope"])
    assert m.parse_args(["--out", "/tmp/x"]).weights == ["separate"]
    assert m.parse_args(["--out", "/tmp/x", "--weights", "fused_linear,separate"]).weights == ["fused_linear", "separate"]
    for bad in ("fused,nope", ","):
        with pytest.raises(SystemExit):
            m.parse_args(["--out", "/tmp/x", "--weights", bad])
    assert "does not split over 3 ranks" in m.tp_experts_problem("deepseek", 3)
    assert all(m.tp_experts_problem(c, ws) is None for ws in WORLD_SIZES for c in m.default_configs(ws))


def test_moe_backend_column_is_the_cost_models_decision(bench):
    """bench_moe's backend column prices the layer as the moe pass does (H200 calibration): the
    DeepSeek-like layer at 4096 tokens per rank and EP 4 is rewritten (symm), the decode-size one
    (128 tokens, host-bound) stays plain; the decision follows the predicted times."""
    from overlap_backend.cost import calibration

    m = bench["bench_moe"]
    cal = calibration.DEFAULTS["h200"]
    big = m.backend_choice("deepseek", 4, grouped_rows=4096 * 8, rows_sent=4096 * 8, cal=cal)
    assert big["decision"] == "symm" and big["predicted_ms"] < big["baseline_predicted_ms"]
    small = m.backend_choice("deepseek-decode", 4, grouped_rows=128 * 8, rows_sent=128 * 8, cal=cal)
    assert small["decision"] == "plain" and small["predicted_ms"] >= 0.9 * small["baseline_predicted_ms"]
    assert m.backend_choice("deepseek", 4, 4096 * 8, 4096 * 8, cal, comm_sms=16)["decision"] in ("symm", "p2p", "plain")


def test_moe_sweep_columns(bench):
    """A sweep column sets only the moe_symm settings it names (joined by +); the rest stay the
    defaults the run started with; comm-SM columns take the SM transport; unknown parts are refused."""
    m = bench["bench_moe"]
    defaults = {"COMM_SMS": None, "TRANSPORT": "ce", "ORDER": "auto", "OWN_FIRST": 0.0, "SCHEDULE": "phased",
                "EXPERT_GEMM": "auto"}
    assert set(defaults) == set(m.SETTINGS)
    assert m.sweep_settings("gemm=grouped_mm+order=expert", defaults) == {**defaults, "EXPERT_GEMM": "grouped_mm",
                                                                          "ORDER": "expert"}
    assert m.sweep_settings("ce-only+schedule=rotated", defaults) == {**defaults, "TRANSPORT": "ce-only",
                                                                      "SCHEDULE": "rotated"}
    assert m.sweep_settings(16, defaults) == {**defaults, "COMM_SMS": 16, "TRANSPORT": "sm"}
    assert m.sweep_settings("own-first=0.25+order=source", {**defaults, "SCHEDULE": "rotated"}) == {
        **defaults, "OWN_FIRST": 0.25, "ORDER": "source", "SCHEDULE": "phased"}
    assert m.sweep_settings("ce", defaults) == {**defaults, "COMM_SMS": m.CE_COMM_SMS}  # (None/0: no comm kernel)
    assert m.sweep_settings("ce", {**defaults, "COMM_SMS": 16}) == {**defaults, "COMM_SMS": 16}
    args = m.parse_args(["--out", "/tmp/x", "--sweep", "ce,ce-only+schedule=rotated", "--comm-sms", ""])
    assert args.sweep == ["ce", "ce-only+schedule=rotated"] and args.comm_sms == []
    for bad in ("bogus", "ce+nope", "schedule=phased+"):
        with pytest.raises(SystemExit):
            m.parse_args(["--out", "/tmp/x", "--sweep", bad])


# ----------------------------------------------------------------------------------- CTA
def test_cta_layouts(bench):
    c = bench["bench_cta"]
    names = {ws: [(lay.name, lay.stages, lay.tp, lay.group, lay.lowering, bool(lay.not_supported))
                  for lay in c.layouts(ws)] for ws in WORLD_SIZES}
    assert names[2] == [("CTA 2", 2, 1, "pair", "symm", False)]
    assert names[4] == [("CTA 2", 2, 1, "pair", "symm", False), ("CTA 2×TP2", 2, 2, "world", "symm", False)]
    assert names[8] == [("CTA 2", 2, 1, "pair", "symm", False), ("CTA 2×TP4", 2, 4, "world", "symm", False),
                        ("CTA 4×TP2", 4, 2, "world", "symm", True), ("p2p stages=4", 4, 8, "world", "p2p", False)]
    assert [c.tp_name(ws) for ws in WORLD_SIZES] == [None, "TP4", "TP8"]


@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_cta_render(bench, ws):
    """The table renders at every world size; a layout that is not supported says so."""
    c, common = bench["bench_cta"], bench["common"]
    args = c.parse_args(["--graphs"])
    row = {"act": "gelu", "M": 128, "1 GPU": 1.0, "TP2": 0.6, "µbatch": 0.7, "µbatch k": 2}
    if c.tp_name(ws):
        row[c.tp_name(ws)] = 0.5
    for lay in c.layouts(ws):
        if lay.not_supported:
            row[lay.name] = None
            continue
        row.update({lay.name: 0.55, f"{lay.name} kc": "ce/4", f"{lay.name} err": 1e-3,
                    f"{lay.name} path": lay.lowering})
        row[f"{lay.name} (graph)"] = 0.4
    row.update({"1 GPU (graph)": 1.0, "TP2 (graph)": 0.5})
    if c.tp_name(ws):
        row[f"{c.tp_name(ws)} (graph)"] = 0.3
    md = c.render([row], ws, common.machine_info(torch.device("cpu"), ws), args)
    assert f"ws={ws}" in md
    header, _, values = md.split("\n\n")[2].splitlines()[:3]
    cells = dict(zip([h.strip() for h in header.strip("|").split("|")], [v.strip() for v in values.strip("|").split("|")]))
    # every supported layout of ours is replayed too, and the bars' ratios are taken on the replays
    assert cells["CTA 2 graph"] == "0.400" and cells["graph: CTA 2 / (1 GPU / 2)"] == "0.80"
    assert cells["graph: TP2 / CTA 2"] == "1.25"
    if c.tp_name(ws):
        wide = next(lay.name for lay in c.layouts(ws) if lay.group == "world" and lay.lowering == "symm")
        assert cells[f"{wide} graph"] == "0.400" and cells[f"graph: {c.tp_name(ws)} / {wide}"] == "0.75"
    if ws == 8:
        assert "| TP8 " in md and "CTA 2×TP4" in md and "TP8 / CTA 2×TP4" in md
        assert "not supported" in md and "p2p stages=4" in md


@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_cta_symm_takes_the_bench_sizes(bench, ws):
    """The symm lowering's preconditions (cta_symm.problem and its flag budget) hold for the
    benchmark's default sizes on rank pairs and on 2 stages x TP<ws/2>; 4 stages are refused."""
    from overlap_backend.runtime import cta_symm
    from overlap_backend.spec import symm_layout

    c = bench["bench_cta"]
    args = c.parse_args([])
    H, F, N = args.hidden, args.ffn, args.hidden
    for act in args.acts:
        for M in args.m:
            for group_ws in sorted({2, ws}):
                assert _cta_symm_problem(cta_symm, symm_layout, M, H, F, N, act, group_ws, args.k_chunks) is None, \
                    (act, M, group_ws)
    if ws == 8:
        why = _cta_symm_problem(cta_symm, symm_layout, 4096, H, F, N, "gelu", 8, [4], stages=4)
        assert why is not None and "stages=4" in why


def test_cta_swiglu_variants_sweep(bench):
    """``--swiglu-shares work,rounds`` times ours with either SwiGLU share sizing, checks each
    non-default variant's result first, labels the best variant, and leaves the CTA knobs as they
    were. (The options of the deleted SwiGLU-tail and eager-graph modes are refused.)"""
    from overlap_backend.spec import knobs

    c = bench["bench_cta"]
    assert c.parse_args([]).swiglu_settings == [("", {"SWIGLU_SHARE_ROUNDS": True})]
    assert c.parse_args([]).gelu_settings == [("", {})]
    both = c.parse_args(["--swiglu-shares", "work,rounds"]).swiglu_settings
    assert [label for label, _ in both] == ["work", ""], both
    for bad in (["--swiglu-tails", "yes"], ["--swiglu-shares", "even"], ["--eager-graphs", "1"]):
        with pytest.raises(SystemExit):
            c.parse_args(bad)
    seen = []
    settings = lambda: (knobs.cta.TRANSPORT, knobs.cta.K_CHUNKS, knobs.cta.SWIGLU_SHARE_ROUNDS)  # noqa: E731

    class Timing:
        def bench(self, fn):
            seen.append(settings())
            return 2.0 + (0.5 if knobs.cta.SWIGLU_SHARE_ROUNDS else 0) + knobs.cta.K_CHUNKS / 100, None

    before = settings()
    row = {}
    best = c._sweep_k_chunks(Timing(), lambda: "out", [4, 8], row, "CTA 2", ("ce",), both,
                             check=lambda out: 0.001 if out == "out" else 1.0)
    assert best == (2.04, "ce/4+work") and row["CTA 2 err work"] == 0.001
    assert "CTA 2 err " not in row  # the defaults are not checked again
    assert row["CTA 2 ce kc=8 work"] == 2.08 and row["CTA 2 ce kc=4"] == 2.54
    assert seen == [("ce", 4, False), ("ce", 8, False), ("ce", 4, True), ("ce", 8, True)]
    assert settings() == before


class _Meta:
    """A tensor as cta_symm.problem looks at it (shape, dtype, device), without memory."""

    def __init__(self, *shape, dtype=torch.bfloat16):
        self.shape, self.dtype, self.device = torch.Size(shape), dtype, torch.device("cuda")

    def dim(self) -> int:
        return len(self.shape)


def _cta_symm_problem(cta_symm, symm_layout, M, H, F, N, act, ws, k_chunks, stages=2, dtype=torch.bfloat16):
    """None when the symm lowering runs cta_pipeline_mlp on its kernels for these sizes (an H200's 132
    SMs), else why not: ``problem``, then the chunk-flag budget the op checks before launching."""
    from overlap_backend.runtime import cta_plan
    from overlap_backend.spec import knobs

    f = F // ws
    w3 = _Meta(H, f, dtype=dtype) if act == "swiglu" else None
    why = cta_symm.problem(_Meta(M, H, dtype=dtype), _Meta(H, f, dtype=dtype), None, w3, None,
                            _Meta(f, N, dtype=dtype), None, act, "tanh" if act == "gelu" else "none", stages, ws)
    if why:
        return why
    tp, swiglu = ws // 2, act == "swiglu"
    for kc in k_chunks:
        with knobs.cta.patch(K_CHUNKS=kc):
            plan = cta_plan.chunk_plan(M, F, N, tp, swiglu, dtype, 132)
        if plan.flag_words > symm_layout.CTA_CHUNK_WORDS // 2:
            return f"K_CHUNKS={kc}: {M} rows need more chunk flags than {symm_layout.CTA_CHUNK_WORDS // 2}"
    return None


# ------------------------------------------------------------------------ block, epilogue
@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_block_and_epilogue_sizes(bench, ws):
    common = bench["common"]
    for name in ("bench_block", "bench_epilogue"):
        mod = bench[name]
        extra = ["--out-dir", "/tmp/x"]
        gpu = mod.parse_args(extra + ["--device", "cuda"], ws=ws)
        assert common.block_sizes_problem(gpu.seq, gpu.hidden, gpu.heads, gpu.ffn, ws) is None, (name, vars(gpu))
        cpu = mod.parse_args(extra + ["--device", "cpu"], ws=ws)
        assert common.block_sizes_problem(cpu.seq, cpu.hidden, cpu.heads, cpu.ffn, ws) is None, (name, vars(cpu))
    # the old fixed CPU size (4 heads) cannot split over 8 ranks: the problem names it
    assert "heads 4" in common.block_sizes_problem(32, 64, 4, 128, 8)
    assert common.block_sizes_problem(32, 64, None, 128, 8) is None  # no attention: heads not split


def test_epilogue_cudagraphs_flag(bench):
    """--cudagraphs: CUDA only, and its results go to files of their own (not over the eager ones)."""
    mod = bench["bench_epilogue"]
    args = mod.parse_args(["--out-dir", "/tmp/x", "--device", "cuda", "--cudagraphs"], ws=2)
    assert args.cudagraphs and mod._tag(args) == "_cudagraphs"
    assert mod._tag(mod.parse_args(["--out-dir", "/tmp/x", "--device", "cuda"], ws=2)) == ""
    with pytest.raises(SystemExit):
        mod.parse_args(["--out-dir", "/tmp/x", "--device", "cpu", "--cudagraphs"], ws=2)


def test_epilogue_variants_are_timed_in_interleaved_rounds(bench):
    """bench_epilogue.time_rounds: A, B, C, A, B, C, ...; a variant's time is the median of its rounds;
    a variant that failed its check (no step) is not timed."""
    mod = bench["bench_epilogue"]
    calls = []

    class FakeTiming:
        def bench(self, step):
            calls.append(step.__name__)
            return {"a": [5.0, 1.0, 3.0], "b": [2.0, 2.5, 9.0]}[step.__name__][calls.count(step.__name__) - 1], 10

    def a():
        pass

    def b():
        pass

    rows = [{"variant": v, "time_ms": None, "reps": None, "round_ms": []} for v in ("a", "failed", "b")]
    mod.time_rounds(rows, [a, None, b], 3, FakeTiming())
    assert calls == ["a", "b", "a", "b", "a", "b"]
    assert rows[0]["round_ms"] == [5.0, 1.0, 3.0] and rows[0]["time_ms"] == 3.0 and rows[0]["reps"] == 30
    assert rows[2]["time_ms"] == 2.5 and rows[1]["time_ms"] is None and rows[1]["round_ms"] == []
    assert "probe_host" in bench and callable(bench["probe_host"].host_us)


def test_epilogue_fused_verdict_is_paired_by_round(bench):
    """The fused epilogues' target from one run: fewer kernels per step and faster in the median and in every round
    (round i of the fused variant against round i of the unfused one)."""
    mod = bench["bench_epilogue"]
    unfused = {"time_ms": 5.33, "round_ms": [5.30, 5.41, 5.33], "kernels_per_step": 147}
    fused = {"time_ms": 5.24, "round_ms": [5.23, 5.33, 5.24], "kernels_per_step": 144}
    v = mod.fused_verdict(fused, unfused)
    assert v["faster_rounds"] == 3 and v["bar"] and abs(v["speedup"] - 5.33 / 5.24) < 1e-12
    # a round in which the fused step was slower: the median alone does not make the bar
    slower = dict(fused, round_ms=[5.23, 5.45, 5.24])
    v = mod.fused_verdict(slower, unfused)
    assert v["faster_rounds"] == 2 and not v["bar"]
    assert not mod.fused_verdict(dict(fused, kernels_per_step=150), unfused)["bar"]  # more kernels
    assert mod.fused_verdict(dict(fused, time_ms=None), unfused) is None


# ------------------------------------------------------------------------------ run_device.sh
def test_run_device_syntax_and_help():
    script = REPO / "bench" / "run_device.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    out = subprocess.run(["bash", str(script), "help"], capture_output=True, text=True, check=True).stdout
    assert "8 GPUs" in out and "bash bench/run_device.sh tests" in out and 'BENCH_WS="8 4 2"' in out
    bad = subprocess.run(["bash", str(script), "nonsense"], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_run_stages_runs_a_stages_file_under_one_deadline(tmp_path):
    """bench/tools/run_stages.sh: each `run NAME CAP CMD` of the stages file runs in the repository root with its log
    under logs/, writes under $RES, reports its exit status; a stage with no time left is NOT STARTED; everything
    comes back as $OUT/run.tgz. A missing stages file is a usage error."""
    import tarfile

    script = REPO / "bench" / "tools" / "run_stages.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    stages = tmp_path / "stages.sh"
    stages.write_text('run hello 30 bash -c "echo hi; echo 42 > $RES/answer.txt; pwd > $RES/cwd.txt"\n'
                      'TAILN=1 run failing 30 bash -c "echo out; exit 3"\n'
                      'run late 600 sleep 1\n')
    out_dir = tmp_path / "out"
    res = subprocess.run(["bash", str(script), str(stages)], capture_output=True, text=True,
                         env={**os.environ, "OUT": str(out_dir), "DEADLINE": "40"}, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "hello rc=0" in res.stdout and "failing rc=3" in res.stdout and "=== late NOT STARTED" not in res.stdout
    with tarfile.open(out_dir / "run.tgz") as tar:
        names = set(tar.getnames())
        assert {"logs/hello.log", "logs/failing.log", "results/answer.txt"} <= names
        assert tar.extractfile("results/answer.txt").read().strip() == b"42"
        # every stage runs in the repository root, where the plans' paths start
        assert Path(tar.extractfile("results/cwd.txt").read().decode().strip()) == REPO
    stages.write_text("run late 600 sleep 1\n")
    res = subprocess.run(["bash", str(script), str(stages)], capture_output=True, text=True,
                         env={**os.environ, "OUT": str(out_dir), "DEADLINE": "10"}, cwd=tmp_path)
    assert "=== late NOT STARTED" in res.stdout
    bad = subprocess.run(["bash", str(script), str(tmp_path / "missing.sh")], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr


_FAKE_NVIDIA_SMI = """#!/bin/bash
[ "$1" = -L ] && for i in $(seq 0 $((FAKE_NGPU - 1))); do echo "GPU $i: NVIDIA H200 (UUID: GPU-$i)"; done
exit 0
"""
_FAKE_TIMEOUT = """#!/bin/bash
shift 3  # -k 5 LIMIT
for a in "$@"; do printf '%s\\n' "$a"; done >> "$FAKE_LOG"
echo "<end>" >> "$FAKE_LOG"
exit 0
"""


def _run_device(tmp_path, ngpu: int, mode: str, **env) -> tuple[list[list[str]], str]:
    """The stage commands run_device.sh issues with ``ngpu`` GPUs (temp dirs replaced by TMP), and its output."""
    fake = tmp_path / f"bin{ngpu}{mode}"
    fake.mkdir()
    for name, text in (("nvidia-smi", _FAKE_NVIDIA_SMI), ("timeout", _FAKE_TIMEOUT)):
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    log, out = tmp_path / f"cmds{ngpu}{mode}", tmp_path / f"out{ngpu}{mode}"
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("PYTHON", "TESTS_K", "TEST_FILES", "BENCHES", "BENCH_WS", "MOE_ARGS", "RUN_DEMO",
                             "RUN_EPILOGUE", "EPILOGUE_WS", "DEADLINE") and not k.startswith("LIMIT_")}
    full_env["RUN_SMOKE"] = "0"  # the smoke stage that full/quick/tests modes run first has tests of its own
    full_env.update(PATH=f"{fake}:{os.environ['PATH']}", FAKE_NGPU=str(ngpu), FAKE_LOG=str(log), OUT=str(out), **env)
    res = subprocess.run(["bash", str(REPO / "bench" / "run_device.sh"), mode], env=full_env, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    text = re.sub(r"/tmp/tmp\.[A-Za-z0-9]+", "TMP", log.read_text()) if log.exists() else ""
    cmds, cur = [], []
    for line in text.splitlines():
        if line == "<end>":
            cmds.append(cur)
            cur = []
        else:
            cur.append(line)
    return cmds, res.stdout


def _pytest(verbosity: str, files: list[str], k: str) -> list[str]:
    script = (f'set -o pipefail; "$0" -m pytest {verbosity} -rA -p no:cacheprovider -m gpu "${{@}}" 2>&1 '
              '| tee "$OUT_LOG"')
    return ["bash", "-c", script, "python3", *files, "-k", k]


def _torchrun(n: int, script: str, *args: str) -> list[str]:
    return ["env", f"CUDA_VISIBLE_DEVICES={','.join(map(str, range(n)))}", "python3", "-m", "torch.distributed.run",
            "--standalone", f"--nproc-per-node={n}", script, *args]


def _benches(n: int, traced: bool) -> list[list[str]]:
    trace = ["--trace", "TMP/traces", "--trace-m", "4096"] if traced else []
    return [
        _torchrun(n, "bench/suites/bench_collective_gemm.py", "--suite", "ag_mm,mm_rs,mm_ar", "--lowerings", "p2p,symm",
                  "--out-dir", "TMP/results", "--graphs", *trace),
        _torchrun(n, "bench/suites/bench_block.py", "--out-dir", "TMP/results", *(["--trace", "TMP/traces"] if traced else [])),
        _torchrun(n, "bench/suites/bench_cta.py", "--out-dir", "TMP/results", "--graphs", "--trace", "TMP/traces"),
    ]


VERSIONS = ["python3", "-m", "bench.tools.common"]
OLD_TESTS = ["tests/gpu/test_gpu.py", "tests/gpu/test_gpu_cta.py"]


def test_run_device_2_and_4_gpus_unchanged(tmp_path):
    """The commands of the script before 8 GPUs were added (bench/run_device.sh at 8ce79dd)."""
    cmds, _ = _run_device(tmp_path, 4, "full")
    assert cmds == [VERSIONS, _pytest("-q", OLD_TESTS, "ws4 and symm or names_op_rank or dead_peer or captured_symm or fast_path"),
                    *_benches(4, True), *_benches(2, False)]
    cmds, out = _run_device(tmp_path, 2, "full")
    assert cmds == [VERSIONS, _pytest("-q", OLD_TESTS, "ws2 and symm or names_op_rank or dead_peer or captured_symm or fast_path"), *_benches(2, False)]
    assert "bench_ws4, block_ws4: skipped, 2 GPU(s)" in out
    cmds, _ = _run_device(tmp_path, 4, "bench")
    assert cmds == [VERSIONS, *_benches(4, True), *_benches(2, False)]
    cmds, _ = _run_device(tmp_path, 2, "quick")
    quick = [_torchrun(2, "bench/suites/bench_collective_gemm.py", "--suite", "ag_mm,mm_rs,mm_ar", "--lowerings",
                       "p2p,symm", "--out-dir", "TMP/results", "--graphs", "--quick"),
             _torchrun(2, "bench/suites/bench_block.py", "--out-dir", "TMP/results", "--quick"),
             _torchrun(2, "bench/suites/bench_cta.py", "--out-dir", "TMP/results", "--graphs", "--trace", "TMP/traces",
                       "--quick")]
    assert cmds == [VERSIONS, _pytest("-q", OLD_TESTS, "ws2 and symm and not compiled"), *quick]


def test_run_device_8_gpus(tmp_path):
    cmds, out = _run_device(tmp_path, 8, "full")
    moe = _torchrun(8, "bench/suites/bench_moe.py", "--out", "TMP/results", "--configs", "deepseek-ep8,deepseek",
                    "--routing", "balanced,skewed", "--comm-sms", "8", "--weights", "separate,fused_linear", "--tp-experts")
    collective, block, cta = _benches(8, True)
    assert cmds == [VERSIONS, _pytest("-v", OLD_TESTS, "ws8 and symm or names_op_rank or dead_peer or captured_symm or fast_path"), collective, moe, block, cta]
    stages = re.findall(r"^=== \[t=\d+s\] (\S+) \(limit", out, re.M)
    assert stages == ["versions", "gpu_tests", "bench_ws8", "moe_ws8", "block_ws8", "cta_ws8"]
    # tests only: every GPU test file, the whole deadline
    cmds, out = _run_device(tmp_path, 8, "tests")
    files = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests" / "gpu").glob("test_gpu*.py"))
    assert cmds == [VERSIONS, _pytest("-v", files, "ws8 and symm or names_op_rank or dead_peer or captured_symm or fast_path")]
    limit = int(re.search(r"gpu_tests \(limit (\d+)s\)", out).group(1))
    assert limit > 500, out  # 540 s less the packaging reserve and what the versions took
    # ws=8, then 4, then 2 on request; traces at ws=8 only
    cmds, out = _run_device(tmp_path, 8, "bench", BENCH_WS="8 4 2", BENCHES="collective")
    assert cmds == [VERSIONS, _benches(8, True)[0], _benches(4, False)[0], _benches(2, False)[0]]


def test_run_device_graphs_benches(tmp_path):
    """BENCHES=graphs: the real models, the TP block's epilogue variants and the MoE layer under CUDA
    graphs, each in its own stage and result files."""
    cmds, out = _run_device(tmp_path, 2, "bench", BENCHES="graphs")
    assert cmds == [
        VERSIONS,
        _torchrun(2, "bench/suites/bench_models.py", "--out", "TMP/results", "--mode", "reduce-overhead", "--sections",
                  "llama,serve"),
        _torchrun(2, "bench/suites/bench_epilogue.py", "--out-dir", "TMP/results", "--block", "tp", "--mode", "train",
                  "--cudagraphs"),
        _torchrun(2, "bench/suites/bench_moe.py", "--out", "TMP/results", "--configs",
                  "deepseek,mixtral,deepseek-decode,mixtral-decode", "--routing", "balanced", "--comm-sms", "",
                  "--sweep", "", "--no-p2p", "--graphs"),
    ]
    stages = re.findall(r"^=== \[t=\d+s\] (\S+) \(limit", out, re.M)
    assert stages == ["versions", "graphs_models_ws2", "graphs_epilogue_ws2", "graphs_moe_ws2"]


def test_collective_table_names_the_symm_path(bench):
    """A row of ours on symm says which path ran where it is not the kernels' default: mm_ar's
    one-shot, mm_rs / mm_ar on cuBLAS (runtime.symm.lowering_helpers.PATHS)."""
    b, common = bench["bench_collective_gemm"], bench["common"]
    rows = []
    for path in ("cuBLAS", "symm", "one-shot"):
        row = {"M": 4096, "K": 7168, "N": 8192, "origin": "test", "local_a": [4096, 3584], "reps": {}, "notes": {},
               "times_ms": {"mm": 0.35, "comm": 0.17, "seq": 0.48, "ours_symm": 0.47},
               "check": {"ours_symm": "PASS"}, "rel_err": {"ours_symm": 2.5e-3}, "symm_path": path}
        b.derive(row, "mm_rs", ["symm"])
        rows.append(row)
    md = b.render("mm_rs", 2, torch.bfloat16, common.machine_info(torch.device("cpu"), 2), rows, ["symm"])
    table = [line for line in md.splitlines() if line.startswith("| 4096")]
    assert len(table) == 3
    assert "PASS (2.5e-03) cuBLAS" in table[0] and "one-shot" in table[2]
    assert "cuBLAS" not in table[1] and "one-shot" not in table[1]


def test_collective_graph_table(bench):
    """``--graphs``: a second table with the replay times and the bar's ratios on them (here the
    eager row misses the bar, the replayed one meets it); a variant not captured shows n/a and why."""
    b, common = bench["bench_collective_gemm"], bench["common"]
    row = {"M": 4096, "K": 7168, "N": 8192, "origin": "test", "local_a": [4096, 3584], "reps": {}, "notes": {},
           "times_ms": {"mm": 0.35, "comm": 0.17, "seq": 0.48, "torch": 0.60, "ours_p2p": 0.9, "ours_symm": 0.47},
           "check": {"ours_p2p": "PASS", "ours_symm": "PASS"}, "rel_err": {"ours_p2p": 1e-3, "ours_symm": 2.5e-3},
           "symm_path": "symm",
           "graph_ms": {"mm": 0.34, "comm": 0.16, "seq": 0.47, "torch": 0.58, "ours_p2p": None, "ours_symm": 0.36},
           "graph_notes": {"ours_p2p": b.GRAPH_SKIP["ours_p2p"]}}
    b.derive(row, "mm_rs", ["p2p", "symm"])
    assert row["meets_bar"] is False  # eager: 0.47 / 0.35 = 1.34
    assert row["graph_symm_over_max"] == pytest.approx(0.36 / 0.34)
    assert row["graph_torch_over_symm"] == pytest.approx(0.58 / 0.36) and row["graph_meets_bar"] is True
    md = b.render("mm_rs", 2, torch.bfloat16, common.machine_info(torch.device("cpu"), 2), [row], ["p2p", "symm"])
    assert "## CUDA-graph replays" in md
    graph_part = md.split("## CUDA-graph replays")[1]
    line = [ln for ln in graph_part.splitlines() if ln.startswith("| 4096")][0]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[-3:] == ["1.06×", "1.61×", "yes"] and "n/a" in cells
    assert "not captured (ours p2p" in graph_part
    with pytest.raises(SystemExit):
        b.parse_args(["--graphs", "--device", "cpu"])
    assert b.parse_args(["--graphs"]).graphs


def test_drop_collectives_leaves_local_stand_ins(bench, fake_pg):
    """bench_models' ``inductor_nocomm`` bound: every collective of a post-grad (ATen) graph becomes a
    local op of its shape (all-gather: the shard repeated; reduce-scatter: this rank's slice copied;
    all-reduce: a copy), the waits go, and the graph still runs."""
    from collections import Counter

    import torch.distributed._functional_collectives as funcol
    from torch._dynamo.backends.common import aot_autograd

    def f(x, w):
        gathered = funcol.all_gather_tensor(x, 0, fake_pg)
        y = funcol.reduce_scatter_tensor(gathered @ w, "sum", 0, fake_pg)
        return funcol.all_reduce(y, "sum", fake_pg) * 2

    dropped: Counter = Counter()
    left: list = []

    def fw(gm, example_inputs):
        bench["bench_block"].drop_collectives(gm.graph, dropped)
        gm.recompile()
        left.extend(str(n.target) for n in gm.graph.nodes if "c10d" in str(n.target))
        return gm.forward

    x, w = torch.randn(8, 16), torch.randn(16, 32)
    out = torch.compile(f, backend=aot_autograd(fw_compiler=fw), fullgraph=True)(x, w)
    assert left == []
    assert dropped == Counter({"all_gather_into_tensor": 1, "reduce_scatter_tensor": 1, "all_reduce": 1})
    # rows of the gathered product that are this rank's slice: the shard's own product (stand-ins are local)
    torch.testing.assert_close(out, (x @ w) * 2)


def test_set_applies_knobs_and_rejects_bad_ones():
    """bench --set: a knob of ``overlap_backend.spec.knobs`` for one run (A/B of settings without an
    environment variable); unknown sets or knobs, a value of another type and a missing value are errors."""
    from bench.tools import common
    from overlap_backend.spec import knobs

    with knobs.cta.patch(K_CHUNKS=4):
        assert common.apply_sets(["cta.K_CHUNKS=8"]) == ["cta.K_CHUNKS=8"]
        assert knobs.cta.K_CHUNKS == 8
    for bad in ("cta.NO_SUCH=1", "config.DEFAULT_PASS_ORDER=()", "cta.K_CHUNKS=yes", "cta.K_CHUNKS"):
        with pytest.raises(ValueError):
            common.apply_sets([bad])


def test_benches_parse_set_through_one_helper(bench, capsys):
    """bench_collective_gemm / bench_models / bench_moe: ``--set`` applied by their argument parsing
    (``common.parse_args_with_sets``), a bad item a usage error naming it."""
    from overlap_backend.spec import knobs

    with knobs.cta.patch(K_CHUNKS=4):
        args = bench["bench_collective_gemm"].parse_args(["--out-dir", "x", "--set", "cta.K_CHUNKS=8"])
        assert args.settings == ["cta.K_CHUNKS=8"] and knobs.cta.K_CHUNKS == 8
    with pytest.raises(SystemExit):
        bench["bench_moe"].parse_args(["--out", "x", "--set", "cta.NO_SUCH=1"])
    assert "has no knob 'NO_SUCH'" in capsys.readouterr().err


def test_trace_compare_sums_categories_and_exclusive_time(tmp_path):
    """bench/tools/trace_compare.py: per category the summed time and the time nothing else runs; the
    kernels whose time differs most between two traces."""
    sys.path.insert(0, str(REPO))
    from bench.tools import trace_compare as tc

    assert [tc.category(n, "kernel") for n in (
        "ncclDevKernel_AllGather_RING_LL", "sm90_xmma_gemm_bf16bf16_bf16f32", "nvjet_tst_128x256", "mm_rs_kernel",
        "ag_mm_kernel", "triton_per_fused_add_0", "flash_fwd_kernel", "CatArrayBatchedCopy", "void at::foo")] == [
        "nccl", "gemm", "gemm", "overlap", "overlap", "triton", "attention", "copy", "other"]
    assert tc.category("Memcpy DtoD (Device -> Device)", "gpu_memcpy") == "copy"

    def trace(path, events):
        evs = [{"cat": cat, "name": name, "ts": ts, "dur": dur} for cat, name, ts, dur in events]
        evs.append({"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1000})  # not GPU activity: ignored
        path.write_text(json.dumps({"traceEvents": evs}))
        return path

    # base: gemm 0-100, nccl 100-150 (exposed); ours: an overlap kernel 0-110 with nccl 20-70 under it
    base = trace(tmp_path / "base.json", [("kernel", "sm90_xmma_gemm", 0, 100), ("kernel", "ncclKernel", 100, 50)])
    ours = trace(tmp_path / "ours.json", [("kernel", "mm_rs_kernel", 0, 110), ("kernel", "ncclKernel", 20, 50),
                                          ("gpu_memcpy", "Memcpy PtoP", 105, 10)])
    s0, s1 = tc.summarize(tc.load(base)), tc.summarize(tc.load(ours))
    assert s0["span_us"] == 150 and s0["total_us"] == {"gemm": 100, "nccl": 50}
    assert s0["exclusive_us"] == {"gemm": 100, "nccl": 50}
    assert s1["span_us"] == 115 and s1["total_us"] == {"overlap": 110, "nccl": 50, "copy": 10}
    assert s1["exclusive_us"] == {"overlap": 20 + 35, "copy": 5}  # nccl never alone: hidden
    text = tc.render([base, ours], [s0, s1], top=3)
    assert "| nccl | 0.050 (0.050) | 0.050 (0.000) |" in text
    assert "+0.110  mm_rs_kernel" in text and "-0.100  sm90_xmma_gemm" in text


def test_bench_models_writes_a_trace_per_variant(tmp_path):
    """``bench_models.py --trace DIR`` (2 gloo ranks, tiny Llama): one trace of a training step per
    variant and rank 0/1, readable by trace_compare."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "bench/suites/bench_models.py",
           "--out", str(tmp_path / "res"), "--device", "cpu", "--sections", "llama", "--variants", "overlap",
           "--quick", "--check-steps", "1", "--trace", str(tmp_path / "tr")]
    subprocess.run(cmd, cwd=REPO, env=env, check=True, timeout=240, capture_output=True)
    names = sorted(p.name for p in (tmp_path / "tr").iterdir())
    assert names == [f"llama_ws2_{v}_rank{r}.json" for v in ("eager", "overlap") for r in (0, 1)]
    out = subprocess.run([sys.executable, "bench/tools/trace_compare.py", *(str(tmp_path / "tr" / n) for n in names[::2])],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "| span |" in out


def test_probe_host_cpu_counts_the_stream_operations_of_a_call():
    """bench/probes/probe_host_cpu.py runs the real cuBLAS paths of mm_rs and ag_mm against a mocked CUDA
    layer. The stream operations per call are the protocol's (rank 0 of 4, one band per chunk):
    mm_rs: READY raised to and awaited from 3 peers, 3 done flags raised and awaited, 3 pushes with
    their arrival flags, 3 arrivals awaited, PEER_OK awaited, 2 progress words; ag_mm: READY, 3
    pushes with their flags, each peer's chunk awaited by the GEMMs and by the gathered copy, PEER_OK,
    2 progress words. A new stream operation per call shows here first."""
    sys.path.insert(0, str(REPO))
    from bench.probes import probe_host_cpu

    res = probe_host_cpu.measure(4, 512, calls=5)
    rs, ag = res["mm_rs (cuBLAS per band)"], res["ag_mm (cuBLAS per chunk)"]
    assert rs["stream_ops"] == {"memcpy_async": 3, "wait_stream": 4, "wait_value32": 10, "write_value32": 11}
    assert ag["stream_ops"] == {"memcpy_async": 3, "wait_stream": 4, "wait_value32": 10, "write_value32": 8}
    assert all(r["us"] > 0 for r in res.values())
    from overlap_backend.runtime import cuda as _cuda
    from overlap_backend.runtime.symm import mm_rs as symm_mm_rs

    # the mocks are undone
    assert symm_mm_rs.rs_gemm.__module__ == symm_mm_rs.__name__ and _cuda.write_value32.__module__ == _cuda.__name__


def test_predict_llama_prices_the_eight_matches_of_a_block(capsys):
    """bench/tools/predict_llama.py: the eight matches of a Llama block at each group size, their shapes as
    the passes build them (QKV with GQA's narrower K/V, sums of matmuls concatenated along K), and per
    step the matched collectives and the predicted saving; graphs never save less than eager calls
    (no host time); bad sizes are rejected."""
    sys.path.insert(0, str(REPO))
    from bench.tools import predict_llama as pl
    from overlap_backend.cost import calibration

    probs = pl.block_problems(4, dim=4096, n_heads=32, n_kv_heads=8, ffn_dim=14336, tokens=8192)
    assert len(probs) == 8
    qkv = probs["fwd ag_mm x -> QKV"]
    assert (qkv.op, qkv.m, qkv.n, qkv.k, qkv.gemms) == ("ag_mm", 8192, (4096 + 2 * 1024) // 4, 4096, 3)
    dgrad = probs["bwd mm_rs d(w1,w3) @ (w1,w3)^T -> RS"]
    assert (dgrad.op, dgrad.n, dgrad.k) == ("mm_rs", 4096, 2 * 14336 // 4)
    with pytest.raises(ValueError, match="do not split over 3 ranks"):
        pl.block_problems(3, dim=4096, n_heads=32, n_kv_heads=8, ffn_dim=14336, tokens=8192)
    cal = calibration.DEFAULTS["h200"]
    eager = pl.step_view(4, pl.LLAMA, cal, cuda_graphs=False)
    graphs = pl.step_view(4, pl.LLAMA, cal, cuda_graphs=True)
    assert eager["comm_ms"] == graphs["comm_ms"] > 0
    assert 0 <= eager["saving_ms"] <= graphs["saving_ms"] < graphs["comm_ms"]
    assert pl.main(["--ws", "2", "--llama", "n_layers=2"]) == 0
    out = capsys.readouterr().out
    assert "### ws 2, CUDA-graph replays" in out and out.count("| fwd ag_mm x -> QKV |") == 2
    with pytest.raises(SystemExit):
        pl.main(["--llama", "depth=3"])


def test_bench_models_loss_curves_of_both_models(tmp_path):
    """``bench_models.py --sections curve,mixtral_curve`` (2 gloo ranks, float32, tiny models): the Llama TP+SP
    and the Mixtral EP curves, every step's loss in the JSON for eager and overlap, the overlap one rewritten
    (the moe pass on Mixtral's forward) and within 1e-4 of eager's at every step."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "bench/suites/bench_models.py",
           "--out", str(tmp_path), "--device", "cpu", "--sections", "curve,mixtral_curve", "--curve", "steps=8",
           "--mixtral_curve", "steps=8"]
    subprocess.run(cmd, cwd=REPO, env=env, check=True, timeout=240, capture_output=True)
    sections = json.loads((tmp_path / "models_ws2.json").read_text())["sections"]
    for section, rewrite in (("curve", "ag_mm"), ("mixtral_curve", "moe")):
        eager, ours = sections[section]["variants"]
        assert (eager["variant"], ours["variant"]) == ("eager", "overlap")
        assert len(eager["losses"]) == len(ours["losses"]) == 8
        assert rewrite in ours["rewrites"], ours["rewrites"]
        assert ours["check"] == "PASS" and ours["compare"]["max_rel_diff"] <= 1e-4
        assert max(abs(a - b) / abs(b) for a, b in zip(ours["losses"], eager["losses"])) <= 1e-4
    md = (tmp_path / "models_ws2.md").read_text()
    assert "## Loss curve, Llama TP + SP training" in md and "## Loss curve, Mixtral EP training" in md
