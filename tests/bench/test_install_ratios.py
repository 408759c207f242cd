"""``bench/tools/install_ratios.py`` (CPU): a run's (GPU, kernel, world size) groups replace the installed ones of that
GPU, kernel and world size (with ``--rows``, its entries of those rows replace their shapes' alone), a later run wins,
everything else stays, and the runtime reads the result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from overlap_backend.spec import kernel_ratios


def _e(gpu, kernel, M, ratio, source="x", ws=4):
    return {"gpu": gpu, "kernel": kernel, "dtype": "bfloat16", "ws": ws, "M": M, "K": 1024, "N": 1024, "fused": False,
            "ratio": ratio, "source": source}


def _run(folder: Path, *entries) -> Path:
    folder.mkdir()
    (folder / "kernel_ratios.json").write_text(json.dumps(kernel_ratios.document(list(entries))))
    return folder


def test_runs_replace_their_gpu_and_kernel_groups_only(tmp_path, bench_tool):
    tool = bench_tool("install_ratios")
    target = tmp_path / "installed.json"
    target.write_text(json.dumps(kernel_ratios.document(
        [_e("A", "mm_rs", 1024, 1.3), _e("A", "mm_rs", 2048, 1.2), _e("A", "ag_mm", 1024, 1.1),
         _e("B", "mm_rs", 1024, 0.9)])))
    one = _run(tmp_path / "one", _e("A", "mm_rs", 4096, 1.05), _e("A", "mm_rs_cublas", 4096, 1.01))
    two = _run(tmp_path / "two", _e("A", "mm_rs_cublas", 4096, 1.02), _e("A", "oneshot", 8, 0.7))
    assert tool.main([str(one), str(two), "--target", str(target), "--kernels", "mm_rs,mm_rs_cublas"]) == 0
    doc = json.loads(target.read_text())
    got = {(e["gpu"], e["kernel"], e["M"]): (e["ratio"], e["source"]) for e in doc["entries"]}
    assert got == {("A", "mm_rs", 4096): (1.05, str(one)), ("A", "ag_mm", 1024): (1.1, "x"),
                   ("B", "mm_rs", 1024): (0.9, "x"), ("A", "mm_rs_cublas", 4096): (1.02, str(two))}
    assert "oneshot" not in doc["about"] and str(two) in doc["about"]
    assert kernel_ratios.measured_ratio("mm_rs_cublas", 4096, 1024, 1024, ws=4, gpu="A", file=target) == 1.02
    before = target.read_text()
    assert tool.main([str(two), "--target", str(target), "--dry-run"]) == 0
    assert target.read_text() == before, "a dry run writes nothing"


def test_a_run_at_one_world_size_replaces_that_world_size_only(tmp_path, bench_tool):
    tool = bench_tool("install_ratios")
    target = tmp_path / "installed.json"
    target.write_text(json.dumps(kernel_ratios.document(
        [_e("A", "ag_mm", 512, 1.5, ws=8), _e("A", "ag_mm", 512, 1.07, ws=4), _e("A", "ag_mm", 4096, 1.02, ws=8)])))
    ws8 = _run(tmp_path / "ws8", _e("A", "ag_mm", 512, 1.06, ws=8))
    assert tool.main([str(ws8), "--target", str(target)]) == 0
    got = {(e["ws"], e["M"]): e["ratio"] for e in json.loads(target.read_text())["entries"]}
    assert got == {(8, 512): 1.06, (4, 512): 1.07}


def test_rows_install_those_shapes_alone(tmp_path, bench_tool):
    """``--rows LO-HI``: a run's entries of that many rows each replace the installed entry of their shape; the
    group's other shapes stay, the run's other rows are not installed."""
    tool = bench_tool("install_ratios")
    target = tmp_path / "installed.json"
    target.write_text(json.dumps(kernel_ratios.document(
        [_e("A", "cta_stage1", 16, 1.2), _e("A", "cta_stage1", 128, 1.6), _e("A", "cta_stage1", 4096, 1.03)])))
    sweep = _run(tmp_path / "sweep", _e("A", "cta_stage1", 16, 1.25), _e("A", "cta_stage1", 128, 1.19))
    assert tool.main([str(sweep), "--target", str(target), "--rows", "65-128"]) == 0
    got = {e["M"]: (e["ratio"], e["source"]) for e in json.loads(target.read_text())["entries"]}
    assert got == {16: (1.2, "x"), 128: (1.19, str(sweep)), 4096: (1.03, "x")}
    with pytest.raises(SystemExit):  # rows not LO-HI
        tool.main([str(sweep), "--target", str(target), "--rows", "128-65"])
