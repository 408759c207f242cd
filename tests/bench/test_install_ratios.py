"""``bench/tools/install_ratios.py`` (CPU): a run's (GPU, kernel) groups replace the installed ones of that GPU and
kernel, a later run wins, everything else stays, and the runtime reads the result."""

from __future__ import annotations

import json
from pathlib import Path

from overlap_backend.spec import kernel_ratios


def _e(gpu, kernel, M, ratio, source="x"):
    return {"gpu": gpu, "kernel": kernel, "dtype": "bfloat16", "ws": 4, "M": M, "K": 1024, "N": 1024, "fused": False,
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
