"""TORCH_LOGS reaches the backend's loggers: ``TORCH_LOGS=overlap_backend`` shows every match decision
in the words of summary.json, ``+overlap_backend`` the DEBUG lines too; without it nothing is printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# One graph with an applied match (ag_mm) and a rejected one (mm_rs: not produced by a matmul).
SCRIPT = r"""
import sys, torch, torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.testing._internal.distributed.fake_pg import FakeStore
import overlap_backend

dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
gather = getattr(funcol, "all_gather_single", funcol.all_gather_tensor)

def f(x, w, v):
    return gather(x, 0, dist.group.WORLD) @ w, funcol.reduce_scatter_tensor(v * 2, "sum", 0, dist.group.WORLD)

torch.compile(f, backend=overlap_backend.make_backend(inductor=False, debug_dir=sys.argv[1]))(
    torch.randn(4, 8), torch.randn(8, 8), torch.randn(8, 8))
print("DONE")
"""


def _run(tmp_path: Path, torch_logs: str | None) -> tuple[str, list[dict]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERLAP_", "TORCH_LOGS"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    if torch_logs is not None:
        env["TORCH_LOGS"] = torch_logs
    dump = tmp_path / (torch_logs or "none").replace("+", "plus_")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(dump)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stderr[-3000:]
    summary = json.loads((dump / "rank0" / "summary.json").read_text())
    return proc.stderr, [m for g in summary["graphs"] for m in g["matches"]]


def _summary_words(match: dict) -> str:
    return json.dumps({k: match[k] for k in ("pass", "applied", "lowering", "nodes", "reason")})


@pytest.mark.parametrize("setting", ["overlap_backend", "+overlap_backend"])
def test_torch_logs_shows_every_decision_in_summary_words(tmp_path, setting):
    stderr, matches = _run(tmp_path, setting)
    assert {m["pass"] for m in matches} == {"ag_mm", "mm_rs"} and any(not m["applied"] for m in matches)
    for m in matches:  # once each: one handler, no line printed twice
        assert stderr.count(_summary_words(m)) == 1, (m, stderr[-3000:])
    debug_line = "wrote " in stderr and "summary.json" in stderr
    assert debug_line == setting.startswith("+"), stderr[-3000:]


def test_without_torch_logs_the_decisions_stay_quiet(tmp_path):
    stderr, matches = _run(tmp_path, None)
    assert matches and not any(_summary_words(m) in stderr for m in matches), stderr[-3000:]


def test_the_alias_is_registered_with_torch_logging():
    import torch._logging._internal as torch_logging

    import overlap_backend  # noqa: F401

    assert torch_logging.log_registry.is_log("overlap_backend")
    assert "overlap_backend" in torch_logging.log_registry.log_alias_to_log_qnames["overlap_backend"]
