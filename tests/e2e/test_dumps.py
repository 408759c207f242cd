"""OVERLAP_DEBUG_DIR: graph before/after each pass, diffs, HTML diff, summary.json."""

import json

import torch
import torch.distributed._functional_collectives as funcol

from overlap_backend import make_backend
from overlap_backend.spec import knobs

all_gather = getattr(funcol, "all_gather_single", funcol.all_gather_tensor)


def test_dump_layout_and_summary(fake_pg, clean_env, tmp_path):
    clean_env.setenv("OVERLAP_DEBUG_DIR", str(tmp_path))

    def f(x, w, v):
        a = all_gather(x, 0, fake_pg) @ w  # rewritten by ag_mm
        b = funcol.reduce_scatter_tensor(v * 2, "sum", 0, fake_pg)  # seen by mm_rs, not a matmul
        return a, b

    backend = make_backend(inductor=False)
    torch.compile(f, backend=backend)(torch.randn(4, 8), torch.randn(8, 8), torch.randn(8, 8))

    rank_dir = tmp_path / "rank1"  # the fake group makes this process rank 1
    summary = json.loads((rank_dir / "summary.json").read_text())
    (graph,) = summary["graphs"]
    assert graph["kind"] == "inference" and graph["id"] == backend.reports[0].id
    by_pass = {m["pass"]: m for m in graph["matches"]}
    assert set(by_pass) == {"ag_mm", "mm_rs"}
    assert by_pass["ag_mm"]["applied"] is True and by_pass["ag_mm"]["lowering"] == "p2p"
    assert "all_gather_into_tensor" in by_pass["ag_mm"]["nodes"] and "mm" in by_pass["ag_mm"]["nodes"]
    assert by_pass["mm_rs"]["applied"] is False and "not produced by a matmul" in by_pass["mm_rs"]["reason"]
    assert set(by_pass["mm_rs"]) == {"pass", "applied", "lowering", "nodes", "reason"}

    gdir = rank_dir / graph["id"]
    files = sorted(p.name for p in gdir.iterdir())
    assert files == [
        "00_before.py", "01_after_ag_mm.py", "01_ag_mm.diff", "02_after_mm_rs.py",
        "03_after_moe_tp_experts.py", "04_after_mm_ar.py", "05_after_moe.py", "diff.html", "ops",
    ]
    # per rewritten op: its generated code and runtime calls (docs/debugging.md)
    assert sorted(p.name for p in (gdir / "ops").iterdir()) == ["ag_mm_default.py"]
    compile((gdir / "ops" / "ag_mm_default.py").read_text(), "ag_mm_default.py", "exec")
    before = (gdir / "00_before.py").read_text()
    assert "all_gather_into_tensor" in before and "overlap.ag_mm" not in before
    diff = (gdir / "01_ag_mm.diff").read_text()
    assert "+" in diff and "torch.ops.overlap.ag_mm.default" in diff and "-" in diff
    assert "torch.ops.aten.mm.default" in diff  # the removed matmul shows on a '-' line
    assert "<table" in (gdir / "diff.html").read_text()


def test_no_dump_without_debug_dir(fake_pg, clean_env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    backend = make_backend(inductor=False)
    torch.compile(lambda x, w: all_gather(x, 0, fake_pg) @ w, backend=backend)(torch.randn(4, 8), torch.randn(8, 8))
    assert backend.reports and list(tmp_path.iterdir()) == []


def test_op_listing_of_a_captured_graph_says_how_its_flags_differ():
    """Under CUDA graphs (PassContext.cuda_graphs) a symm op's runtime-call listing carries the note on
    the toggling flag block; an eager one and a p2p one do not."""
    from overlap_backend.runtime import plan

    args = {"shard": torch.empty(512, 128, device="meta", dtype=torch.bfloat16),
            "weights": [torch.empty(128, 256, device="meta", dtype=torch.bfloat16)], "biases": [None],
            "gather_dim": 0, "group_name": "g", "lowering": "symm", "return_gathered": False}
    captured = plan.render("ag_mm", args, 0, 2, captured=True)
    compile(captured, "ag_mm.py", "exec")
    assert "symm_layout.GRAPH_BLOCK + w" in captured and "def ag_mm_calls():" in captured
    assert "GRAPH_BLOCK" not in plan.render("ag_mm", args, 0, 2)
    assert "GRAPH_BLOCK" not in plan.render("ag_mm", {**args, "lowering": "p2p"}, 0, 2, captured=True)


def test_op_listing_follows_ag_mms_gemm_path(monkeypatch):
    """ag_mm's runtime-call listing says what the runtime runs: one launch of the consumer kernel per
    weight, or (AG_MM_GEMM = "cublas") cuBLAS GEMMs per chunk, the own chunk first and each peer's
    after a stream wait on its last band's flag."""
    from overlap_backend.runtime import plan
    from overlap_backend.runtime.symm import ag_mm as symm_ag_mm
    from overlap_backend.spec import knobs

    args = {"shard": torch.empty(2, 256, 128, device="meta", dtype=torch.bfloat16),
            "weights": [torch.empty(128, 256, device="meta", dtype=torch.bfloat16)] * 2, "biases": [None, None],
            "gather_dim": 1, "group_name": "g", "lowering": "symm", "return_gathered": False}
    monkeypatch.setattr(symm_ag_mm, "ag_mm_problem", lambda *a: None)  # meta tensors stand for CUDA ones
    with knobs.symm.patch(AG_MM_GEMM="triton"):
        kernel = plan.render("ag_mm", args, 1, 4)
    assert kernel.count("launch(ag_mm_kernel") == 2 and "cuBLAS" not in kernel
    with knobs.symm.patch(AG_MM_GEMM="cublas"):
        listing = plan.render("ag_mm", args, 1, 4)
    compile(listing, "ag_mm.py", "exec")
    assert "launch(ag_mm_kernel" not in listing
    gemms = [line.strip() for line in listing.splitlines() if line.strip().startswith("outs[")]
    assert len(gemms) == 4 * 2 * 2  # chunks x weights x outer indices
    assert gemms[0].startswith("outs[0][0, 1] = shard[0]") and "buf[2][0]" in gemms[4]  # own chunk, then rank 2's
    waits = [line for line in listing.splitlines() if "AG_ARRIVED" in line and "stream=compute" in line]
    assert len(waits) == 3


def _moe_args(ws: int, comm_sms: int, lowering: str = "symm") -> dict:
    meta = dict(device="meta", dtype=torch.bfloat16)
    rows = 4096  # >= ws x experts x 128: the remote-first order (below: expert-major, one launch pair)
    return {"x": torch.empty(rows, 128, **meta), "send_splits": [rows // ws] * ws, "recv_splits": [rows // ws] * ws,
            "rows": torch.empty(rows, device="meta", dtype=torch.int32), "offsets": None, "group_sizes": [rows // 4] * 4,
            "w_gate": torch.empty(4, 128, 256, **meta), "w_up": torch.empty(4, 128, 256, **meta),
            "w_down": torch.empty(4, 256, 128, **meta), "group_name": "g", "lowering": lowering,
            "saved": [False] * 5, "comm_sms": comm_sms}


def test_moe_listing_follows_the_combine_transport(monkeypatch):
    """moe_experts' runtime-call listing follows moe_symm's decisions: with no comm SMs (the default) the
    copy engine pushes each source's results and copies the peers' out (a stream wait each); with comm
    SMs a comm kernel copies them out; a captured call never has one; p2p: shift steps by source."""
    from overlap_backend.runtime import moe_symm, plan

    monkeypatch.setattr(moe_symm, "problem", lambda *a: None)  # meta tensors stand for CUDA ones
    ws, rank = 4, 1
    for comm_sms, captured in ((0, False), (8, False), (8, True)):
        listing = plan.render("moe_experts", _moe_args(ws, comm_sms), rank, ws, captured)
        compile(listing, "moe_experts.py", "exec")
        lines = listing.splitlines()
        kernel = any("launch(comm_kernel" in line for line in lines)
        assert kernel == (comm_sms > 0 and not captured), listing
        pushes = [line for line in lines if "cuMemcpyAsync(dst=peer_buf(" in line]
        assert len(pushes) == 2 * (ws - 1)  # dispatch and combine, to every peer
        copy_outs = [line for line in lines if "MOE_RETURNED" in line and "stream=copy_stream" in line]
        assert len(copy_outs) == (0 if kernel else ws - 1)
        assert sum("launch(gate_up_kernel" in line for line in lines) == ws  # phased: one pair per source
    decode = {**_moe_args(ws, 0), "rows": torch.empty(64, device="meta", dtype=torch.int32)}
    listing = plan.render("moe_experts", decode, rank, ws)
    compile(listing, "moe_experts.py", "exec")
    assert listing.count("launch(gate_up_kernel") == 1 and "expert-major" in listing  # one pair, all groups
    with knobs.moe.patch(SCHEDULE="rotated"):
        listing = plan.render("moe_experts", _moe_args(ws, 0), rank, ws)
    compile(listing, "moe_experts.py", "exec")
    assert f"start_group={(ws - 1) * 4}" in listing  # the own groups first
    p2p = plan.render("moe_experts", _moe_args(ws, 0, "p2p"), rank, ws)
    compile(p2p, "moe_experts.py", "exec")
    assert p2p.count("batch_isend_irecv") == 2 * (ws - 1) and "own rows last" in p2p


def _moe_problems(debug_dir) -> list[dict]:
    """The cost model's problem of every moe_experts match in rank 1's summary.json."""
    summary = json.loads((debug_dir / "rank1" / "summary.json").read_text())
    return [m["cost"]["problem"] for g in summary["graphs"] for m in g["matches"]
            if m.get("cost", {}).get("problem", {}).get("op") == "moe_experts"]


@torch._dynamo.config.patch(capture_scalar_outputs=True)
def test_moe_op_is_dumped(fake_pg, clean_env, tmp_path):
    """OVERLAP_DEBUG_DIR: a rewritten MoE block gets its ops/<node>.py listing like the GEMM ops."""
    from overlap_backend.models.moe import MoELayer

    clean_env.setenv("OVERLAP_DEBUG_DIR", str(tmp_path))
    torch.manual_seed(0)
    layer = MoELayer(16, 32, 2 * fake_pg.size(), top_k=2, policy="capacity", expert_form="grouped_mm",
                     capacity_factor=1.0)
    backend = make_backend(inductor=False)
    with torch.no_grad():
        torch.compile(layer, backend=backend, fullgraph=True)(torch.randn(6, 16))
    (ops_dir,) = list((tmp_path / "rank1").glob("*/ops"))
    (listing,) = [p for p in ops_dir.iterdir() if p.name.startswith("moe_experts")]
    text = listing.read_text()
    compile(text, listing.name, "exec")
    assert "def moe_experts_calls():" in text and "lowering 'p2p'" in text, text
    # capacity routing: the split sizes are graph constants, so the cost model prices the private graphs
    found = _moe_problems(tmp_path)
    assert found and all(pr.get("fixed_splits") is True for pr in found), found


@torch._dynamo.config.patch(capture_scalar_outputs=True)
def test_dropless_moe_is_priced_with_its_host_time(fake_pg, clean_env, tmp_path):
    """Dropless routing: the split sizes come from the counts on every call, so no private graph serves its
    calls and the cost model's problem says so (no fixed_splits)."""
    from overlap_backend.models.moe import MoELayer

    clean_env.setenv("OVERLAP_DEBUG_DIR", str(tmp_path))
    torch.manual_seed(0)
    layer = MoELayer(16, 32, 2 * fake_pg.size(), top_k=2, policy="dropless", expert_form="grouped_mm")
    with torch.no_grad():
        torch.compile(layer, backend=make_backend(inductor=False), fullgraph=True)(torch.randn(6, 16))
    found = _moe_problems(tmp_path)
    assert found and not any(pr.get("fixed_splits") for pr in found), found


def test_cta_listing_follows_the_plan(monkeypatch):
    """cta_pipeline_mlp's listing: stage 0 pushes each (row group, K-chunk) block to every stage-1 rank
    of its plan (copy engine) and launches its kernel (and its tail's); stage 1 launches the share and
    the stage-1 kernel; p2p: one ring per micro-chunk. Every listing is valid Python."""
    from overlap_backend.runtime import cta_plan, cta_symm, plan

    meta = dict(device="meta", dtype=torch.bfloat16)
    ws, F = 4, 28672
    args = {"x": torch.empty(1024, 8192, **meta), "w1": torch.empty(8192, F // ws, **meta), "b1": None, "w3": None,
            "b3": None, "w2": torch.empty(F // ws, 8192, **meta), "b2": None, "activation": "gelu",
            "approximate": "tanh", "stages": 2, "group_name": "g", "lowering": "symm"}
    monkeypatch.setattr(cta_symm, "problem", lambda *a: None)  # meta tensors stand for CUDA ones
    p = cta_plan.chunk_plan(1024, F, 8192, ws // 2, False, torch.bfloat16, 132, H=8192)
    stage0, stage1 = (plan.render("cta_pipeline_mlp", args, r, ws) for r in (1, 2))
    for text in (stage0, stage1):
        compile(text, "cta.py", "exec")
    blocks = sum(min(p.nch, -(-(p.fship if g == p.tail_group else (F - p.f1) // 2) // p.kchunk)) for g in range(p.groups))
    assert stage0.count("cuMemcpyAsync(dst=peer_buf(") == blocks * (ws // 2) and blocks > 0
    assert "launch(stage0_kernel, x, placed.w1, position=1" in stage0 and "stage1_kernel" not in stage0
    assert ("launch(tail_kernel" in stage0) == bool(p.tail)
    assert "launch(stage1_kernel" in stage1 and "peer_buf(" not in stage1 and "this rank is stage 1" in stage1
    p2p = plan.render("cta_pipeline_mlp", {**args, "lowering": "p2p"}, 1, 2)
    compile(p2p, "cta.py", "exec")
    assert p2p.count("all_gather_async") == 2 and p2p.count("batch_isend_irecv") == 2


def test_cta_op_is_dumped(fake_pg, clean_env, tmp_path):
    """OVERLAP_DEBUG_DIR: a rewritten TP MLP gets its ops/<node>.py listing; on CPU tensors its symm
    lowering falls back to p2p, and the listing says why before the p2p calls."""
    import torch.nn.functional as F

    clean_env.setenv("OVERLAP_DEBUG_DIR", str(tmp_path))

    def mlp(x, w1, w2):
        return funcol.all_reduce(F.gelu(x @ w1, approximate="tanh") @ w2, "sum", fake_pg)

    backend = make_backend(inductor=False, passes=["cta_pipeline"], lowering="symm")
    torch.compile(mlp, backend=backend, fullgraph=True)(torch.randn(6, 8), torch.randn(8, 16), torch.randn(16, 8))
    (ops_dir,) = list((tmp_path / "rank1").glob("*/ops"))
    (listing,) = [p for p in ops_dir.iterdir() if p.name.startswith("cta_pipeline_mlp")]
    text = listing.read_text()
    compile(text, listing.name, "exec")
    assert "symm falls back to p2p: " in text and "lowering 'p2p'" in text, text


def _broken_debug_dirs(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory")
    return {"a file": a_file, "under a file": a_file / "dumps"}


def test_a_debug_dir_that_cannot_hold_dumps_costs_the_dumps_not_the_model(fake_pg, clean_env, tmp_path, caplog):
    """OVERLAP_DEBUG_DIR naming a file, or a path no directory can be made at: the model compiles,
    runs and is rewritten as without it (plain Inductor would run it); one warning per path names the
    variable and the path."""
    import logging

    for what, path in _broken_debug_dirs(tmp_path).items():
        clean_env.setenv("OVERLAP_DEBUG_DIR", str(path))
        torch._dynamo.reset()
        backend = make_backend(inductor=False)
        fn = torch.compile(lambda x, w: all_gather(x, 0, fake_pg) @ w, backend=backend)
        x, w = torch.randn(4, 8), torch.randn(8, 8)
        with caplog.at_level(logging.WARNING, logger="overlap_backend"):
            caplog.clear()
            out = fn(x, w)
            fn(x + 1, w)  # same graph, no second warning
            torch._dynamo.reset()
            torch.compile(lambda x, w: all_gather(x, 0, fake_pg) @ w + 1, backend=backend)(x, w)  # a second graph
        assert out.shape == (16, 8), what
        assert [m.applied for r in backend.reports for m in r.matches] == [True, True], what
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, (what, warnings)
        assert "OVERLAP_DEBUG_DIR" in warnings[0] and str(path) in warnings[0], warnings
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_a_dump_that_fails_midway_stops_the_dumps_not_the_pipeline(fake_pg, clean_env, tmp_path, monkeypatch, caplog):
    """A write that fails after the directory was made (a full disk, a directory removed under us)."""
    import logging
    from pathlib import Path

    real_write = Path.write_text

    def write_text(self, *args, **kwargs):
        if self.name.endswith("_after_ag_mm.py"):
            raise OSError(28, "No space left on device")
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    backend = make_backend(inductor=False, debug_dir=str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="overlap_backend"):
        out = torch.compile(lambda x, w: all_gather(x, 0, fake_pg) @ w, backend=backend)(torch.randn(4, 8),
                                                                                         torch.randn(8, 8))
    assert out.shape == (16, 8) and backend.reports[0].matches[0].applied
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "No space left on device" in warnings[0] and str(tmp_path) in warnings[0], warnings
