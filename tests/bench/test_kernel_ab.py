"""``bench/tools/kernel_ab.py`` (CPU): two kernel benchmark runs side by side."""

from __future__ import annotations

import json

import pytest


def _run(folder, rows):
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({"info": {"gpu": "G"}, "rows": rows}))
    return folder


def _row(label, baseline, op):
    return {"label": label, "baseline_ms": baseline, "op_ms": op, "op_ratio": op / baseline,
            "op_config": [64, 256, 64, 8, 3, 8, False]}


def test_ab_table_compares_each_shape_against_its_own_runs_baseline(tmp_path, bench_tool):
    tool = bench_tool("kernel_ab")
    before = _run(tmp_path / "before", [_row("a", 1.0, 2.0), _row("b", 1.0, 1.0), _row("only-before", 1.0, 1.0),
                                        {"label": "c", "error": "set-up failed"}])
    after = _run(tmp_path / "after", [_row("a", 0.8, 0.8), _row("b", 1.0, 1.1), _row("c", 1.0, 1.0)])
    text = tool.table(tool.measured(before), tool.measured(after))
    lines = [line for line in text.splitlines() if line.startswith("| a ") or line.startswith("| b ")]
    # the change is the ratio's (1.0 / 2.0), not the times' (0.8 / 2.0): each run's ratio is to its own baseline
    assert lines[0].startswith("| a | 1.000 / 0.800 | 2.000 | 2.000 **>1.03** | 0.800 | 1.000 | 64x256x64 g8 s3 w8 | 0.500 |")
    assert lines[1].endswith("| 1.100 |") and "1.100 **>1.03**" in lines[1]
    assert "only-before" not in text and "| c " not in text, "shapes of both runs only, errors left out"
    assert "2 shapes" in text and f"before {2 ** 0.5:.3f} (1 over 1.03), after {1.1 ** 0.5:.3f} (1 over)" in text
    assert f"after over before, geo-mean {(0.5 * 1.1) ** 0.5:.3f}" in text
    out = tmp_path / "ab.md"
    tool.main([str(before), str(after), "--out", str(out)])
    assert out.read_text() == text
    with pytest.raises(SystemExit):
        tool.table(tool.measured(before), {})
