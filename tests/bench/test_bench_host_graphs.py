"""CPU check of ``bench/suites/bench_host.py``'s moe and cta graphs: their passes rewrite them.

On 2 gloo ranks (``tests/dist_harness.py``, ``OVERLAP_INDUCTOR=0``), small sizes, bf16: each graph compiled with
the benchmark's own backend (cost model off, lowering ``p2p``) is rewritten into its op (the benchmark's
``check_applied``) and computes what the eager graph does; the same builders on a one-rank group (the Inductor
baseline when ranks share a GPU) take the same inputs and weights.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dist_harness import run_ranks

REPO = Path(__file__).resolve().parents[2]
SIZES = dict(hidden=64, moe_ffn=32, mlp_ffn=256)
M = 16  # tokens per rank


def _worker(rank, ws):
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from bench.suites import bench_host as bh

    solo = None
    for r in range(ws):  # as bench_host.setup: every rank makes every one-rank group
        g = dist.new_group([r])
        solo = g if r == rank else solo
    over, base = bh.graphs(dist.group.WORLD, ws, **SIZES), bh.graphs(solo, ws, **SIZES)
    out = {}
    for op in ("moe", "cta"):
        torch._dynamo.reset()
        torch.manual_seed(0)  # the same weights on every rank: the cta graph's x is replicated, as in TP
        g = over[op]
        x = torch.randn(g.rows(M), g.cols, dtype=torch.bfloat16)
        w = g.weights("cpu", torch.bfloat16)
        backend = bh.make_backend(op, "p2p")
        got = torch.compile(g.fn, backend=backend, dynamic=False, fullgraph=True)(x, *w)
        bh.check_applied(op, backend.reports, {}, "p2p")  # raises unless the pass rewrote the graph
        ref = g.fn(x, *w)
        pass_name = bh.CHECKED[op][1]
        b = base[op]
        solo_out = funcol.wait_tensor(b.fn(torch.randn(b.rows(M), b.cols, dtype=torch.bfloat16), *w))  # its shapes
        out[op] = {
            "err": ((got.double() - ref.double()).norm() / ref.double().norm()).item(),
            "ref_norm": ref.double().norm().item(),
            "matches": [(m.applied, m.lowering) for r in backend.reports for m in r.matches if m.pass_name == pass_name],
            "shapes": (tuple(got.shape), tuple(solo_out.shape)),
        }
    return out


@pytest.mark.timeout(240)
def test_moe_and_cta_graphs_are_rewritten():
    per_rank = run_ranks(_worker, 2, env={"OVERLAP_COST_MODEL": "off"}, timeout=200)
    for rank, res in enumerate(per_rank):
        for op, r in res.items():
            assert r["matches"] == [(True, "p2p")], f"rank {rank} {op}: {r['matches']}"
            assert r["ref_norm"] > 0 and r["err"] <= 1e-2, f"rank {rank} {op}: rel err {r['err']}, |ref| {r['ref_norm']}"
            assert r["shapes"][0] == r["shapes"][1], f"rank {rank} {op}: {r['shapes']}"


@pytest.fixture
def bench_host():
    """``bench.suites.bench_host`` imported here (``bench.tools.common`` sets NCCL variables: undone after)."""
    import importlib
    import os

    env = dict(os.environ)
    sys.path.insert(0, str(REPO))
    try:
        yield importlib.import_module("bench.suites.bench_host")
    finally:
        os.environ.clear()
        os.environ.update(env)
        sys.path.remove(str(REPO))


def test_check_applied_needs_the_pass_and_symm(bench_host):
    from types import SimpleNamespace as NS

    bh = bench_host
    rewritten = [NS(matches=[NS(pass_name="moe", applied=True, reason="rewritten")])]
    bh.check_applied("moe", rewritten, {"moe_experts:symm": 3, "moe_experts:symm:triton": 3}, "symm")
    bh.check_applied("mm_ar", [], {}, "symm")  # the other ops are not checked
    for reports, took in ((rewritten, {"moe_experts:p2p": 3}), (rewritten, {}),
                          ([NS(matches=[NS(pass_name="moe", applied=False, reason="no")])], {"moe_experts:symm": 3})):
        with pytest.raises(RuntimeError):
            bh.check_applied("moe", reports, took, "symm")
