"""The all-gather → mm rewrite looks through a no-op slice of the gathered tensor (DTensor's
un-padding under dynamic shapes, ``slice(g, 0, 0, sys.maxsize)`` or ``g[: g.shape[0]]``), as through
a reshape; a slice that drops rows is not the gathered tensor and is not looked through.

Exact-graph checks with the fake process group (4 ranks) and ``OVERLAP_INDUCTOR=0``.
"""

import sys

import pytest
import torch
import torch.distributed._functional_collectives as funcol

from overlap_backend import make_backend

all_gather = getattr(funcol, "all_gather_single", funcol.all_gather_tensor)
WS = 4


def compile_and_run(fn, *args, dynamic=None):
    backend = make_backend(inductor=False)
    out = torch.compile(fn, backend=backend, fullgraph=True, dynamic=dynamic)(*args)
    return backend, out


def ops_of(backend, target):
    return [n for g in backend.graphs for n in g.nodes if n.target is target]


def ag_mm_matches(backend):
    return [m for r in backend.reports for m in r.matches if m.pass_name == "ag_mm"]


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("end", ["maxsize", "size"])
def test_ag_mm_through_noop_slice(fake_pg, capture, dynamic, end):
    def f(x, w):
        g = all_gather(x, 0, fake_pg)
        g = torch.ops.aten.slice.Tensor(g, 0, 0, sys.maxsize if end == "maxsize" else g.shape[0])
        return g @ w

    x = torch.randn(8, 16)
    if dynamic:
        torch._dynamo.mark_dynamic(x, 0)
    be, out = compile_and_run(f, x, torch.randn(16, 32))
    assert len(ops_of(be, torch.ops.overlap.ag_mm.default)) == 1, [m.reason for m in ag_mm_matches(be)]
    assert not ops_of(be, torch.ops._c10d_functional.all_gather_into_tensor.default)
    assert not ops_of(be, torch.ops.aten.slice.Tensor)
    assert [m.applied for m in ag_mm_matches(be)] == [True]
    assert out.shape == (8 * WS, 32)


def test_ag_mm_through_noop_slice_of_sequence_parallel_gather(fake_pg, capture):
    """The split/cat form (gather along the sequence dim) followed by a full-range slice, 3-D, dynamic."""

    def f(x, w):
        g = all_gather(x, 1, fake_pg)
        g = torch.ops.aten.slice.Tensor(g, 1, 0, g.shape[1])
        return g @ w

    x = torch.randn(2, 3, 16)
    torch._dynamo.mark_dynamic(x, 1)
    be, out = compile_and_run(f, x, torch.randn(16, 24))
    assert len(ops_of(be, torch.ops.overlap.ag_mm.default)) == 1, [m.reason for m in ag_mm_matches(be)]
    assert out.shape == (2, 3 * WS, 24)


def test_slice_that_drops_rows_is_not_looked_through(fake_pg, capture):
    def f(x, w):
        return all_gather(x, 0, fake_pg)[1:] @ w

    be, out = compile_and_run(f, torch.randn(8, 16), torch.randn(16, 32))
    assert not ops_of(be, torch.ops.overlap.ag_mm.default)
    assert [m.applied for m in ag_mm_matches(be)] == [False]
    assert out.shape == (8 * WS - 1, 32)
