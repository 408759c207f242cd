"""bench/probes/run_case.py: the program a profiler wraps runs the benchmark's case in the asked config, checked."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rc():
    sys.path.insert(0, str(REPO))
    try:
        yield importlib.import_module("bench.probes.run_case")
    finally:
        sys.path.remove(str(REPO))


def test_runs_the_asked_config_checked_and_timed(rc):
    import triton

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8))
    case = rc.parse_case("mm_rs", 2, "128x32x64")
    cfg = (16, 16, 16, 2, 1, 1, True)  # a TMA-store config, not the op's first candidate
    err, ran, kernel_ms, base_ms = rc.run(case, cfg, 2, True, torch.device("cpu"), torch.float32)
    assert err <= 1e-5 and ran == cfg
    assert len(kernel_ms) == 2 and len(base_ms) == 2 and all(t > 0 for t in kernel_ms + base_ms)
    from overlap_backend.spec import knobs

    first = (16, 32, 16, 2, 1, 1, False)
    with knobs.codegen.patch(CANDIDATES_32BIT=(first, cfg[:6] + (False,))):  # no config asked: the op's first
        err, ran, kernel_ms, base_ms = rc.run(case, None, 1, False, torch.device("cpu"), torch.float32)
    assert err <= 1e-5 and ran == first and base_ms == []


def test_a_shape_that_is_not_mxkxn_is_refused(rc):
    with pytest.raises(SystemExit, match="not MxKxN"):
        rc.parse_case("ag_mm", 4, "8192x4096")
