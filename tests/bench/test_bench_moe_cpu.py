"""``bench/suites/bench_moe.py --device cpu`` on 2 gloo ranks: every expert-weight layout and the
tensor-parallel experts' table compute what their baselines do, and the result files say so.

The fused layouts hand the op the two halves of one gate/up weight as views (as the ``moe`` pass does), and
the baseline runs one grouped GEMM on that weight; a layout whose halves or GEMM were wired wrongly would
differ from it by far more than the tolerance.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_bench_moe_cpu_checks_every_form(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "bench/suites/bench_moe.py", "--device", "cpu", "--configs", "tiny", "--weights",
           "separate,fused,fused_linear", "--tp-experts", "--quick", "--out", str(out)]
    run = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    data = json.loads((out / "moe_ws2.json").read_text())
    ep = data["results"]
    assert sorted((r["routing"], r["weights"]) for r in ep) == sorted(
        (routing, w) for routing in ("balanced", "skewed") for w in ("separate", "fused", "fused_linear"))
    for r in ep:
        assert "error" not in r, r
        assert r["err_p2p"] <= 1e-2, r
        assert r["times_ms"]["p2p"] > 0 and r["times_ms"]["baseline"] > 0, r
        assert "symm" not in r["times_ms"] and "sweep" not in r, r  # (no symm on gloo)
        # timed once, then in two interleaved rounds: each column the median of its three timings
        assert set(r["round_ms"]) == {"baseline", "a2a", "experts"} and len(r["round_ms"]["baseline"]) == 3, r
        assert r["times_ms"]["a2a"] == sorted(r["round_ms"]["a2a"])[1], r
    tp = data["tp_experts"]
    assert [r["routing"] for r in tp] == ["balanced", "skewed"]
    for r in tp:
        assert "error" not in r, r
        assert r["err_p2p"] <= 1e-2, r
        assert set(r["times_ms"]) == {"baseline", "gemm", "ar", "max", "p2p"}, r
    table = (out / "moe_ws2.md").read_text()
    assert "## Tensor-parallel experts" in table and "fused_linear" in table, table
