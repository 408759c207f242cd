"""Inductor's FX-graph and AOT-autograd caches stay on under the overlap backend: a second process that
compiles the same graph hits them, with the rewrite in the code it loads and the same reports (replayed,
since the pass does not run on a hit); a changed knob is a miss, and so is a changed config (the same key)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# One rank of a fake 2-rank group: all-gather -> mm forward and backward (ag_mm / mm_rs rewrites), run
# through run_and_get_code so the output code is seen whether it was generated or loaded.
SCRIPT = r"""
import json, sys
import torch, torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch._dynamo.utils import counters
from torch._inductor.utils import run_and_get_code
from torch.testing._internal.distributed.fake_pg import FakeStore
import overlap_backend
from overlap_backend.spec import knobs

if sys.argv[1] == "knob":
    knobs.cta.set(K_CHUNKS=8)
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
gather = getattr(funcol, "all_gather_single", funcol.all_gather_tensor)
w = torch.randn(8, 16, requires_grad=True)

def step(x):
    return (gather(x, 0, dist.group.WORLD) @ w).sum()

fn = torch.compile(step, backend="overlap")
_, codes = run_and_get_code(lambda: fn(torch.randn(4, 8, requires_grad=True)).backward())
print(json.dumps({
    "fx_hit": counters["inductor"]["fxgraph_cache_hit"], "fx_miss": counters["inductor"]["fxgraph_cache_miss"],
    "aot_hit": counters["aot_autograd"]["autograd_cache_hit"],
    "aot_miss": counters["aot_autograd"]["autograd_cache_miss"],
    "rewritten_in_code": any("torch.ops.overlap.ag_mm" in c for c in codes),
    "decisions": [(r.kind, m.pass_name, m.applied, m.lowering, m.reason) for r in overlap_backend.REPORTS
                  for m in r.matches],
}))
"""


def _compile(tmp_path: Path, variant: str = "same", **env_extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERLAP_", "TORCH_LOGS", "TORCHINDUCTOR_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), OVERLAP_CACHE_DIR=str(tmp_path / "overlap"),
               **env_extra)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, variant], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_second_process_hits_inductors_caches_with_the_rewrite_and_its_reports(tmp_path):
    cold = _compile(tmp_path)
    assert cold["fx_miss"] >= 2 and cold["fx_hit"] == 0 and cold["aot_hit"] == 0, cold
    assert cold["rewritten_in_code"], cold
    kinds = {(kind, name, applied) for kind, name, applied, *_ in cold["decisions"]}
    assert ("forward", "ag_mm", True) in kinds and ("backward", "mm_rs", True) in kinds, cold

    warm = _compile(tmp_path)  # AOT-autograd cache hit: forward and backward loaded at once
    assert warm["aot_hit"] == 1 and warm["fx_hit"] >= 2 and warm["fx_miss"] == 0, warm
    assert warm["rewritten_in_code"] and warm["decisions"] == cold["decisions"], (warm, cold)

    fx_only = _compile(tmp_path, TORCHINDUCTOR_AUTOGRAD_CACHE="0")  # FX-graph cache hits, backward lazily
    assert fx_only["fx_hit"] >= 2 and fx_only["fx_miss"] == 0, fx_only
    assert fx_only["rewritten_in_code"] and fx_only["decisions"] == cold["decisions"], fx_only

    # a knob the pipeline reads changed: compiled afresh (a config field changes the same key:
    # test_pipeline_key_covers_config_knobs_groups_and_source)
    knob = _compile(tmp_path, "knob")
    assert knob["aot_hit"] == 0 and knob["fx_hit"] == 0 and knob["fx_miss"] >= 2, knob
    assert knob["decisions"] == cold["decisions"]

    dumps = tmp_path / "dumps"  # OVERLAP_DEBUG_DIR: the caches are off, so every graph's dumps are written
    debug = _compile(tmp_path, OVERLAP_DEBUG_DIR=str(dumps))
    assert debug["aot_hit"] == 0 and debug["fx_hit"] == 0 and debug["decisions"] == cold["decisions"], debug
    summary = json.loads((dumps / "rank0" / "summary.json").read_text())
    assert [g["kind"] for g in summary["graphs"]] == ["forward", "backward"]
    assert all((dumps / "rank0" / g["id"] / "00_before.py").exists() for g in summary["graphs"])


def test_pipeline_key_covers_config_knobs_groups_and_source():
    """The uuid Inductor keys its caches with changes with everything the rewrite depends on besides the
    graph, and not with where files go."""
    from overlap_backend import OverlapConfig, backend
    from overlap_backend.spec import knobs

    groups = (backend.GroupFacts("0", "nccl", 2, None, (("cuda", "h200:abc"),)),)
    base = backend.pipeline_key(OverlapConfig(), groups)
    assert base == backend.pipeline_key(OverlapConfig(), groups)
    assert base == backend.pipeline_key(OverlapConfig(debug_dir="/tmp/x", cache_dir="/tmp/y"), groups)
    assert base != backend.pipeline_key(OverlapConfig(min_numel=1), groups)
    assert base != backend.pipeline_key(OverlapConfig(passes=("ag_mm", "mm_rs", "mm_ar", "moe")), groups)  # named
    assert base != backend.pipeline_key(OverlapConfig(), ())
    assert base != backend.pipeline_key(OverlapConfig(), (backend.GroupFacts("0", "nccl", 2, "no peer access",
                                                                             (("cuda", "h200:abc"),)),))
    assert base != backend.pipeline_key(OverlapConfig(), (backend.GroupFacts("0", "nccl", 2, None,
                                                                             (("cuda", "h200:def"),)),))
    with knobs.cta.patch(K_CHUNKS=8):
        assert base != backend.pipeline_key(OverlapConfig(), groups)
    assert len(backend.source_digest()) == 64


def test_groups_are_agreed_before_inductors_cache_is_asked(fake_pg, clean_env, monkeypatch):
    """The passes' per-group agreements (symm support, the calibration: collectives on NCCL groups) run
    in the backend call on every rank, before compile_fx looks at its caches, so a rank whose cache misses
    never waits in a collective that a rank whose cache hit skips."""
    import torch
    import torch._inductor.compile_fx as cfx
    import torch.distributed._functional_collectives as funcol

    from overlap_backend import backend as backend_mod
    from overlap_backend.cost import decision as cost_decision
    from overlap_backend.runtime import symm

    events = []
    real_support, real_calibration = symm.group_support, cost_decision.calibration_for
    monkeypatch.setattr(symm, "group_support", lambda name: events.append(("symm", name)) or real_support(name))
    monkeypatch.setattr(cost_decision, "calibration_for",
                        lambda name, *a, **k: events.append(("calibration", name)) or real_calibration(name, *a, **k))

    def cached_compile_fx(gm, example_inputs, **kwargs):
        events.append(("compile_fx", kwargs["config_patches"]["post_grad_custom_post_pass"].uuid()))
        return gm.forward  # as if every graph came from the cache: the pass never runs

    monkeypatch.setattr(cfx, "compile_fx", cached_compile_fx)
    gather = getattr(funcol, "all_gather_single", funcol.all_gather_tensor)
    be = backend_mod.make_backend()
    torch.compile(lambda x, w: gather(x, 0, fake_pg) @ w, backend=be)(torch.randn(4, 8), torch.randn(8, 8))
    name = fake_pg.group_name
    assert events[:2] == [("symm", name), ("calibration", name)] and events[2][0] == "compile_fx", events
    assert be.reports == []  # nothing ran, nothing was stored for this graph: nothing to replay


def test_without_custom_graph_pass_the_caches_are_off_as_before(fake_pg, clean_env, monkeypatch, caplog):
    """A torch without ``CustomGraphPass``: the pipeline runs as a plain post-grad callable with both caches
    off (Inductor could not key it), and the log says why."""
    import logging

    import torch
    import torch._inductor.compile_fx as cfx

    from overlap_backend import backend as backend_mod

    seen = []

    def spy(gm, example_inputs, **kwargs):
        seen.append((kwargs["config_patches"], torch._functorch.config.enable_autograd_cache))
        return gm.forward

    monkeypatch.setattr(cfx, "compile_fx", spy)
    monkeypatch.setattr(backend_mod, "CustomGraphPass", None)
    monkeypatch.setattr(backend_mod, "_said", set())
    with caplog.at_level(logging.INFO, logger="overlap_backend"):
        torch.compile(lambda x: torch.relu(x) + 1, backend=backend_mod.make_backend())(torch.randn(8))
    ((patches, autograd_cache),) = seen
    assert patches["fx_graph_cache"] is False and autograd_cache is False
    assert not isinstance(patches["post_grad_custom_post_pass"], backend_mod.PipelinePass)
    assert "caches are off for this compile" in caplog.text and "CustomGraphPass" in caplog.text
