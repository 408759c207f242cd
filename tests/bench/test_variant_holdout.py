"""bench/tools/variant_holdout.py: a run's op times with and without the variant an earlier ratio file adopts."""

from __future__ import annotations

import importlib
import json

from overlap_backend.spec import kernel_ratios

GPU = "Test GPU"
FLAT = [128, 256, 64, 8, 4, 8, "tma_subtile_flatten"]


def test_holdout_times_the_adopted_variant_in_the_later_run(tmp_path):
    tool = importlib.import_module("bench.tools.variant_holdout")
    case = {"kernel": "ag_mm", "ws": 4, "M": 8192, "K": 4096, "N": 3584, "epilogue": "", "moe": ""}
    other = {**case, "N": 1536}
    entries = [{"gpu": GPU, "kernel": "ag_mm", "dtype": "bfloat16", "ws": 4, "M": 8192, "K": 4096, "N": 3584,
                "fused": False, "ratio": 1.05, "best_variant_ratio": 1.01, "best_config": FLAT}]
    (tmp_path / "before.json").write_text(json.dumps(kernel_ratios.document(entries)))
    op_cfg = {"config": [128, 256, 64, 8, 3, 8, True], "kind": "op", "ms": 1.0}
    rows = [{"case": case, "op_ratio": 1.04, "op_ms": 1.0, "configs": [op_cfg, {"config": FLAT, "kind": "variant",
                                                                               "ms": 0.98}]},
            {"case": other, "op_ratio": 1.06, "op_ms": 0.5, "configs": [op_cfg]},  # far from the entry: none
            {"case": {**case, "kernel": "cta_stage0"}, "op_ratio": 1.2, "op_ms": 1.0, "configs": []}]
    got = tool.holdout(rows, tmp_path / "before.json", GPU)
    assert len(got) == 2, "only ag_mm / mm_rs / mm_ar rows"
    assert tuple(got[0]["variant"]) == tuple(FLAT) and got[0]["timed"]
    assert abs(got[0]["with"] - 1.04 * 0.98) < 1e-12 and got[0]["without"] == 1.04
    assert got[1]["variant"] is None and got[1]["with"] == got[1]["without"] == 1.06
    rows[0]["configs"][1]["ms"] = 1.3  # slower this time: the op keeps its candidate
    got = tool.holdout(rows, tmp_path / "before.json", GPU)
    assert got[0]["with"] == got[0]["without"] == 1.04
    text = tool.markdown(got, "RUN", "REV:file")
    assert "| ag_mm  | 2     | 1 " in text and "tma_subtile_flatten" in text and "REV:file" in text
