"""Smoke test of ``bench/tools/predict_tables.py`` (CPU): it writes predicted 2-, 4- and 8-GPU tables of the
collective-GEMM, MoE and end-to-end suites, labelled as predictions, beside the measured numbers it found."""

from __future__ import annotations

import json


def test_predict_tables_writes_labelled_predictions_beside_measurements(tmp_path, bench_tool):
    tool = bench_tool("predict_tables")
    assert tool.main(["--out-dir", str(tmp_path), "--ws", "2,4,8", "--quiet"]) == 0
    md = (tmp_path / "table.md").read_text()
    assert "**Predictions**, not measurements" in md
    for ws in (2, 4, 8):
        assert f"## {ws} GPUs" in md
    for section in ("### Collective GEMMs", "### MoE layer", "### End to end"):
        assert md.count(section) == 3, section
    data = json.loads((tmp_path / "predicted.json").read_text())
    rows = data["rows"]
    assert {r["suite"] for r in rows} == {"collective", "moe", "end_to_end"}
    assert {r["ws"] for r in rows} == {2, 4, 8}
    for r in rows:
        assert all(v is None or v > 0 for k, v in r.items() if k.startswith("pred_")), r
    # the measured folders INDEX.md names are found (2 and 4 GPUs), and 8 GPUs has none
    measured = [r for r in rows if r["suite"] == "collective" and r["meas_plain"] is not None]
    assert {r["ws"] for r in measured} == {2, 4}
    assert all(r["meas_plain"] is None for r in rows if r["ws"] == 8 and r["suite"] != "end_to_end")
    # the one-shot's sum on its path (torch.sum, or the kernel at its measured ratio)
    assert any(r.get("gemm_path", "").startswith("cuBLAS + ") for r in rows)
    e2e = [r for r in rows if r["suite"] == "end_to_end" and r["ws"] == 4]
    assert all(r["meas_inductor"] and r["pred_step"] < r["meas_inductor"] for r in e2e if r["pred_saving"])
    assert "predict_tables.py" in (tmp_path / "command.txt").read_text()
    assert "kernel_ratios.json` (NVIDIA H200: bench/results/kernels_h200x1_" in (tmp_path / "README.md").read_text()


def test_every_measured_source_exists(bench_tool):
    tool = bench_tool("predict_tables")
    for suite, by_ws in tool.MEASURED.items():
        for ws, folders in by_ws.items():
            assert all((tool.RESULTS / f).exists() for f in folders), (suite, ws, folders)
