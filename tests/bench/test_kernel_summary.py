"""``bench/tools/kernel_summary.py`` (CPU): the README's kernel table from a run folder's results and ratios."""

from __future__ import annotations

import json

import pytest

from overlap_backend.spec import kernel_ratios


def _row(kernel, M, ratio, epilogue=""):
    return {"case": {"kernel": kernel, "ws": 4, "M": M, "K": 1024, "N": 4096, "epilogue": epilogue, "moe": ""},
            "op_ratio": ratio, "op_ms": ratio}


def test_summary_counts_shapes_within_the_bar_per_kernel_and_on_the_ops_path(tmp_path, bench_tool):
    tool = bench_tool("kernel_summary")
    rows = [_row("mm_rs", 4096, 1.3), _row("mm_rs", 8192, 1.02), _row("mm_rs", 8192, 1.1, "add:0"),
            _row("mm_rs_cublas", 4096, 1.01), _row("oneshot", 128, 0.8), {"case": _row("ag_mm", 1, 1)["case"],
                                                                         "error": "set-up failed"}]
    entries = [{"gpu": "G", "kernel": r["case"]["kernel"], "dtype": "bfloat16", "ws": 4, "M": r["case"]["M"],
                "K": 1024, "N": 4096, "fused": bool(r["case"]["epilogue"]), "ratio": r["op_ratio"]}
               for r in rows if "op_ratio" in r]
    (tmp_path / "results.json").write_text(json.dumps({"info": {"gpu": "G"}, "rows": rows}))
    (tmp_path / "kernel_ratios.json").write_text(json.dumps(kernel_ratios.document(entries)))
    s = tool.summarize(tmp_path)
    assert set(s) == {"mm_rs", "mm_rs (fused)", "mm_rs_cublas", "oneshot"}, "errors left out, fused apart"
    assert (s["mm_rs"]["shapes"], s["mm_rs"]["within"], s["mm_rs"]["worst"]) == (2, 1, 1.3)
    assert s["mm_rs"]["median"] == pytest.approx(1.16)
    # 4096: the kernel loses, its measured cuBLAS path (1.01) is taken; 8192: within, the rules keep the kernel
    # at K = 1024 (below knobs.symm.RS_CUBLAS_MIN_K)
    assert (s["mm_rs"]["path_within"], s["mm_rs"]["path_unmeasured"]) == (2, 0)
    assert s["mm_rs"]["path_geo"] == pytest.approx((1.01 * 1.02) ** 0.5)
    assert s["oneshot"]["path_geo"] == pytest.approx(0.8) and not s["mm_rs_cublas"]["has_path"]
    text = tool.table([("X", s)])
    assert "| `mm_rs`" in text and "1 / 2" in text and "2 (1.01×)" in text and "| -" in text
    assert tool.main([f"X={tmp_path}"]) == 0
    with pytest.raises(SystemExit):
        tool.main([str(tmp_path)])


def test_a_run_read_over_earlier_runs_of_its_gpu(tmp_path, bench_tool):
    """A run that measured only the cuBLAS paths, read over the run that measured the kernels (``--over``): the
    kernels' rows come from the earlier run, the op's path reads the later run's path ratio; a run of another GPU
    is refused."""
    tool = bench_tool("kernel_summary")

    def run(name, rows, gpu="G"):
        folder = tmp_path / name
        folder.mkdir()
        entries = [{"gpu": gpu, "kernel": r["case"]["kernel"], "dtype": "bfloat16", "ws": 4, "M": r["case"]["M"],
                    "K": 1024, "N": 4096, "fused": False, "ratio": r["op_ratio"]} for r in rows]
        (folder / "results.json").write_text(json.dumps({"info": {"gpu": gpu}, "rows": rows}))
        (folder / "kernel_ratios.json").write_text(json.dumps(kernel_ratios.document(entries)))
        return folder

    kernels = run("kernels", [_row("mm_rs", 4096, 1.3), _row("mm_rs_cublas", 4096, 1.5)])
    paths = run("paths", [_row("mm_rs_cublas", 4096, 1.01)])
    alone = tool.summarize(paths)
    assert set(alone) == {"mm_rs_cublas"}
    s = tool.summarize(paths, [kernels])
    assert set(s) == {"mm_rs", "mm_rs_cublas"}
    assert s["mm_rs"]["path_geo"] == pytest.approx(1.01), "the later run's path, faster than the kernel"
    assert tool.summarize(kernels)["mm_rs"]["path_geo"] == pytest.approx(1.3), "alone: the path measured slower"
    assert tool.main([f"X={paths}", "--over", f"X={kernels}"]) == 0
    other = run("other", [_row("mm_rs", 4096, 1.2)], gpu="H")
    with pytest.raises(SystemExit, match="runs of one GPU"):
        tool.summarize(paths, [other])
