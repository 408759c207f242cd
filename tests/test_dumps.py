"""OVERLAP_DEBUG_DIR: graph before/after each pass, diffs, HTML diff, summary.json."""

import json

import torch
import torch.distributed._functional_collectives as funcol

from overlap_backend import make_backend

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
        "00_before.py", "01_after_ag_mm.py", "01_ag_mm.diff", "02_after_mm_rs.py", "03_after_mm_ar.py",
        "04_after_moe.py", "diff.html", "ops",
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
    assert "symm.GRAPH_BLOCK + w" in captured and "def ag_mm_calls():" in captured
    assert "GRAPH_BLOCK" not in plan.render("ag_mm", args, 0, 2)
    assert "GRAPH_BLOCK" not in plan.render("ag_mm", {**args, "lowering": "p2p"}, 0, 2, captured=True)


def test_op_listing_follows_ag_mms_gemm_path(monkeypatch):
    """ag_mm's runtime-call listing says what the runtime runs: one launch of the consumer kernel per
    weight, or (AG_MM_GEMM = "cublas") cuBLAS GEMMs per chunk, the own chunk first and each peer's
    after a stream wait on its last band's flag."""
    from overlap_backend.runtime import plan, symm_lowering

    args = {"shard": torch.empty(2, 256, 128, device="meta", dtype=torch.bfloat16),
            "weights": [torch.empty(128, 256, device="meta", dtype=torch.bfloat16)] * 2, "biases": [None, None],
            "gather_dim": 1, "group_name": "g", "lowering": "symm", "return_gathered": False}
    monkeypatch.setattr(symm_lowering, "_ag_mm_problem", lambda *a: None)  # meta tensors stand for CUDA ones
    monkeypatch.setattr(symm_lowering, "AG_MM_GEMM", "triton")
    kernel = plan.render("ag_mm", args, 1, 4)
    assert kernel.count("launch(ag_mm_kernel") == 2 and "cuBLAS" not in kernel
    monkeypatch.setattr(symm_lowering, "AG_MM_GEMM", "cublas")
    listing = plan.render("ag_mm", args, 1, 4)
    compile(listing, "ag_mm.py", "exec")
    assert "launch(ag_mm_kernel" not in listing
    gemms = [line.strip() for line in listing.splitlines() if line.strip().startswith("outs[")]
    assert len(gemms) == 4 * 2 * 2  # chunks x weights x outer indices
    assert gemms[0].startswith("outs[0][0, 1] = shard[0]") and "buf[2][0]" in gemms[4]  # own chunk, then rank 2's
    waits = [line for line in listing.splitlines() if "AG_ARRIVED" in line and "stream=compute" in line]
    assert len(waits) == 3
