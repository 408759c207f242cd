"""Symbolic shapes: ``dynamic=True`` / ``mark_dynamic`` on the token dimension.

The passes match on SymInt sizes; preconditions are decided with the ShapeEnv (facts that hold for
every length need no guard; others install a guard, so a length that breaks them recompiles). The
graph is compiled once and runs several lengths without recompiling.
"""

import re

import pytest
import torch
import torch.distributed._functional_collectives as funcol

from dist_harness import run_ranks
from overlap_backend import make_backend

all_gather = getattr(funcol, "all_gather_single", funcol.all_gather_tensor)
reduce_scatter = getattr(funcol, "reduce_scatter_single", funcol.reduce_scatter_tensor)
WS = 4
OV = torch.ops.overlap
C10D = torch.ops._c10d_functional


class Counting:
    """The overlap backend, counting the frames Dynamo compiles with it."""

    def __init__(self, **kw):
        self.backend = make_backend(**kw)
        self.frames = 0

    def __call__(self, gm, example_inputs):
        self.frames += 1
        return self.backend(gm, example_inputs)

    def decisions(self):
        return [(r.kind, m.pass_name, m.applied, m.reason) for r in self.backend.reports for m in r.matches]


def targets(graph):
    return [n.target for n in graph.nodes if n.op == "call_function"]


def _has_symbolic_input(graph):
    return any(
        n.op == "placeholder" and isinstance(n.meta.get("val"), torch.SymInt) for n in graph.nodes
    )


# ------------------------------------------------------------------- exact graphs, fake group
def test_dynamic_ag_mm_and_mm_rs_dim0(fake_pg, capture):
    def f(x, w1, w2):
        h = all_gather(x, 0, fake_pg) @ w1
        return reduce_scatter(torch.relu(h) @ w2, "sum", 0, fake_pg)

    be = Counting(inductor=False)
    c = torch.compile(f, backend=be, fullgraph=True, dynamic=True)
    w1, w2 = torch.randn(16, 32), torch.randn(32, 16)
    for rows in (8, 5, 11):
        out = c(torch.randn(rows, 16), w1, w2)
        assert out.shape == (rows, 16)
    assert be.frames == 1
    (g,) = be.backend.graphs
    assert _has_symbolic_input(g)
    t = targets(g)
    assert OV.ag_mm.default in t and OV.mm_rs.default in t
    assert C10D.all_gather_into_tensor.default not in t and C10D.reduce_scatter_tensor.default not in t
    op = next(n for n in g.nodes if n.target is OV.mm_rs.default)
    out_shape = op.args[3]
    assert any(isinstance(s, torch.fx.Node) for s in out_shape)  # the symbolic rows travel as a node
    assert all(ok for _, _, ok, _ in be.decisions()), be.decisions()


def test_mark_dynamic_sequence_parallel_swiglu(fake_pg, capture):
    """The sequence dim of the sequence-parallel shard (dim 1) marked dynamic: forward and backward."""
    from overlap_backend.models import TPSwiGLUMlp

    m = TPSwiGLUMlp(32, 64, fake_pg)
    be = Counting(inductor=False)
    c = torch.compile(m, backend=be)
    for s in (3, 6, 9):
        x = torch.randn(2, s, 32, requires_grad=True)
        torch._dynamo.mark_dynamic(x, 1)
        y = c(x)
        y.sum().backward()
        assert y.shape == (2, s, 32) and x.grad.shape == x.shape
    assert be.frames == 1
    fw, bw = be.backend.graphs
    assert _has_symbolic_input(fw)
    assert {OV.ag_mm.default, OV.mm_rs.default} <= set(targets(fw))
    assert OV.ag_mm.default in targets(bw)
    applied = {(k, p) for k, p, ok, _ in be.decisions() if ok}
    assert {("forward", "ag_mm"), ("forward", "mm_rs"), ("backward", "ag_mm")} <= applied


def test_dynamic_mm_ar_rows_guard_recompiles(fake_pg, capture):
    """``mm_ar`` needs at least ws rows: with a symbolic row count the pass installs the guard
    ``rows >= ws``; a shorter input recompiles, and that graph reports why it is not rewritten."""

    def f(x, w1, w2):
        return funcol.all_reduce(torch.relu(x @ w1) @ w2, "sum", fake_pg)

    be = Counting(inductor=False)
    c = torch.compile(f, backend=be, fullgraph=True, dynamic=True)
    w1, w2 = torch.randn(16, 32), torch.randn(32, 16)
    for rows in (8, 6, 13):
        assert c(torch.randn(rows, 16), w1, w2).shape == (rows, 16)
    assert be.frames == 1
    assert OV.mm_ar.default in targets(be.backend.graphs[0])
    c(torch.randn(3, 16), w1, w2)  # 3 < WS rows: the guard fails
    assert be.frames == 2
    last = be.backend.reports[-1].matches
    assert [(m.pass_name, m.applied) for m in last] == [("mm_ar", False)]
    assert "too few rows" in last[0].reason
    assert OV.mm_ar.default not in targets(be.backend.graphs[-1])


def test_dynamic_reshape_3d_mm_ar(fake_pg, capture):
    """``[b, s, h] -> [b*s, h] -> mm -> [b, s, n] -> all_reduce``: the op's result is reshaped back
    with symbolic sizes taken from the graph."""

    def f(x, w):
        return funcol.all_reduce(x @ w, "sum", fake_pg)

    be = Counting(inductor=False)
    c = torch.compile(f, backend=be, fullgraph=True, dynamic=True)
    w = torch.randn(16, 8)
    for s in (4, 7):
        assert c(torch.randn(2, s, 16), w).shape == (2, s, 8)
    assert be.frames == 1
    assert OV.mm_ar.default in targets(be.backend.graphs[0])


# ------------------------------------------------------------------------ gloo numerics, 2 ranks
def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    if torch.isnan(a).any() or torch.isnan(b).any():
        return float("nan")
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def dynamic_numerics_worker(rank, ws, lengths):
    """TP+SP block (the demo's) and the all-reduce MLP, each compiled once, several token lengths."""
    import torch

    from overlap_backend.models import TPBlock, TPMlpAllReduce

    results = {}
    for name in ("sp_block", "mlp_all_reduce"):
        torch._dynamo.reset()
        if name == "sp_block":
            ref_m, cmp_m = (TPBlock(hidden=32, heads=4, ffn=64, seed=0) for _ in range(2))
        else:
            ref_m, cmp_m = (TPMlpAllReduce(hidden=32, ffn=64, seed=0) for _ in range(2))
        be = Counting(inductor=False)
        compiled = torch.compile(cmp_m, backend=be)
        errs = []
        for s in lengths:
            g = torch.Generator().manual_seed(s)
            if name == "sp_block":
                x = torch.randn(2, s * ws, 32, generator=g).chunk(ws, dim=1)[rank].contiguous()
                dyn_dim = 1
            else:
                x = torch.randn(s, 32, generator=g)
                dyn_dim = 0
            outs = []
            for model in (ref_m, compiled):
                model.zero_grad()
                xi = x.clone().requires_grad_(True)
                if model is compiled:
                    torch._dynamo.mark_dynamic(xi, dyn_dim)
                out = model(xi)
                probe = torch.cos(torch.arange(out.numel(), dtype=out.dtype)).view(out.shape)
                (out * probe).sum().backward()
                outs.append([out.detach(), xi.grad] + [p.grad for p in model.parameters()])
            errs.append([_rel(a, b) for a, b in zip(outs[1], outs[0])])
        results[name] = {"errs": errs, "frames": be.frames, "decisions": be.decisions()}
        if name == "mlp_all_reduce":
            # 1 row < ws: outside the compiled graph's range; recompiles, mm_ar is rejected, still exact
            x = torch.randn(1, 32, generator=torch.Generator().manual_seed(1))
            with torch.no_grad():
                got, ref = compiled(x), ref_m(x)
            results["short"] = {"err": _rel(got, ref), "frames": be.frames,
                                "last": [(m.pass_name, m.applied, m.reason) for m in be.backend.reports[-1].matches]}
    return results


@pytest.mark.timeout(300)
def test_dynamic_gloo_compile_once_matches_eager():
    lengths = (3, 5, 8)
    per_rank = run_ranks(dynamic_numerics_worker, 2, lengths, timeout=280)
    expected = {
        "sp_block": {("forward", "ag_mm"), ("forward", "mm_rs"), ("backward", "ag_mm"), ("backward", "mm_rs")},
        "mlp_all_reduce": {("forward", "mm_ar")},
    }
    for name, want in expected.items():
        first = per_rank[0][name]
        for rank, r in enumerate(per_rank):
            res = r[name]
            assert res["frames"] == 1, f"{name} rank {rank}: {res['frames']} compiles for lengths {lengths}"
            for s, errs in zip(lengths, res["errs"]):
                assert all(e <= 1e-4 for e in errs), f"{name} rank {rank} length {s}: rel errors {errs}"
            assert res["decisions"] == first["decisions"], f"{name}: rank {rank} decided differently"
        applied = {(k, p) for k, p, ok, _ in first["decisions"] if ok}
        assert want <= applied, f"{name}: {first['decisions']}"
    for r in per_rank:
        short = r["short"]
        assert short["frames"] == 2 and short["err"] <= 1e-4, short
        assert [(p, ok) for p, ok, _ in short["last"]] == [("mm_ar", False)] and "too few rows" in short["last"][0][2]


def dynamic_inductor_worker(rank, ws):
    import torch
    import torch.distributed as dist

    group = dist.group.WORLD
    g = torch.Generator().manual_seed(0)
    w1 = torch.randn(32, 64 * ws, generator=g).chunk(ws, dim=1)[rank].contiguous()
    w2 = torch.randn(64 * ws, 32, generator=g).chunk(ws)[rank].contiguous()

    def block(x):
        h = torch.nn.functional.gelu(all_gather(x, 1, group) @ w1)
        return x + reduce_scatter(h @ w2, "sum", 1, group)

    be = Counting(inductor=True)
    compiled = torch.compile(block, backend=be, dynamic=True)
    errs = []
    with torch.no_grad():
        for s in (3, 6):
            x = torch.randn(2, s * ws, 32, generator=g).chunk(ws, dim=1)[rank].contiguous()
            errs.append(_rel(compiled(x), block(x)))
    return errs, be.frames, be.decisions()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dynamic_inductor_sp_mlp_inference(clean_env):
    per_rank = run_ranks(dynamic_inductor_worker, 2, timeout=280, env={"OVERLAP_INDUCTOR": "1"})
    for errs, frames, decisions in per_rank:
        assert frames == 1 and all(e <= 1e-4 for e in errs), (errs, frames)
        assert decisions == per_rank[0][2]
        applied = {(k, p) for k, p, ok, _ in decisions if ok}
        assert {("inference", "ag_mm"), ("inference", "mm_rs")} <= applied, decisions


# ------------------------------------------------------------------------- decisions, ShapeEnv
def _symint(shape_env, hint):
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    return shape_env.create_unspecified_symint_and_symbol(hint, ConstantSource(f"s_{hint}"), DimDynamic.DYNAMIC)


def test_decide_known_facts_need_no_guard_others_guard():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from overlap_backend.passes import common

    env = ShapeEnv()
    s0 = _symint(env, 6)
    assert common.known_true((4 * s0) % 4 == 0) and common.known_eq(2 * s0 * 3, 6 * s0)
    assert common.decide((4 * s0) % 4 == 0) and not env.guards  # a fact for every s0: no guard
    assert not common.known_true(s0 % 2 == 0)
    assert common.decide(s0 % 2 == 0)  # decided by the hint (6) ...
    assert len(env.guards) == 1  # ... with a guard on it


def test_decide_in_backward_installs_no_guard():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from overlap_backend.passes import common
    from overlap_backend.passes.manager import Rejected

    env = ShapeEnv()
    s0 = _symint(env, 5)
    token = common.GUARDS_ALLOWED.set(False)
    try:
        assert common.decide((2 * s0) % 2 == 0)  # known: fine without a guard
        with pytest.raises(Rejected, match="no guard is installed in a backward graph"):
            common.decide(s0 >= 4)
    finally:
        common.GUARDS_ALLOWED.reset(token)
    assert not env.guards


def test_dynamic_mm_rs_dim0_divisibility_from_the_graph(fake_pg, capture):
    """``reduce_scatter(x @ w)`` with symbolic rows: funcol's own divisibility check is guarded by
    Dynamo, which makes ``rows % ws == 0`` a fact of the ShapeEnv for the pass."""

    def f(x, w):
        return reduce_scatter(x @ w, "sum", 0, fake_pg)

    be = Counting(inductor=False)
    c = torch.compile(f, backend=be, fullgraph=True, dynamic=True)
    w = torch.randn(16, 5)  # no size equal to a row count (duck shaping would tie them)
    for rows in (8, 12, 20):
        assert c(torch.randn(rows, 16), w).shape == (rows // WS, 5)
    assert be.frames == 1
    assert OV.mm_rs.default in targets(be.backend.graphs[0]), be.decisions()


def test_tp_sp_block_dynamic_decides_as_static(fake_pg, capture):
    """The demo's TP+SP block: with ``dynamic=True`` every pass decides exactly as with static
    shapes, captured epilogues included (bias, residual add)."""
    from overlap_backend.models import TPBlock

    decisions = {}
    for dynamic in (False, True):
        torch._dynamo.reset()
        be = Counting(inductor=False)
        c = torch.compile(TPBlock(32, 4, 64, fake_pg), backend=be, dynamic=dynamic)
        x = torch.randn(2, 3, 32, requires_grad=True)
        c(x).sum().backward()
        decisions[dynamic] = [
            (r.kind, m.pass_name, m.applied, re.sub(r"\b(add|mm|view)_\d+", r"\1_N", m.reason),
             [e.get("spec") for e in (m.epilogue or [])])
            for r in be.backend.reports for m in r.matches
        ]
    assert decisions[True] == decisions[False]
    assert ("forward", "mm_rs", True, "rewritten", ["add:0"]) in decisions[True]


def test_dynamic_min_numel_guard(fake_pg, capture):
    """``OVERLAP_MIN_NUMEL`` on a symbolic output size: decided by the hint with a guard."""

    def f(x, w):
        return all_gather(x, 0, fake_pg) @ w

    be = Counting(inductor=False, min_numel=1000)
    c = torch.compile(f, backend=be, fullgraph=True, dynamic=True)
    w = torch.randn(16, 32)
    for rows in (8, 10):  # 4 * rows * 32 >= 1000
        assert c(torch.randn(rows, 16), w).shape == (WS * rows, 32)
    assert be.frames == 1 and [ok for _, _, ok, _ in be.decisions()] == [True]
    c(torch.randn(5, 16), w)  # 640 elements: the guard fails, the new graph is not rewritten
    assert be.frames == 2
    (last,) = be.backend.reports[-1].matches
    assert not last.applied and "OVERLAP_MIN_NUMEL=1000" in last.reason


# ------------------------------------------------------------------- cta_pipeline, symbolic tokens
def _gelu_tp_mlp(group):
    import torch.nn.functional as F

    def f(x, w1, b1, w2, b2):
        return funcol.all_reduce(F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2), "sum", group)

    return f


def test_dynamic_cta_pipeline_compiles_once(fake_pg, capture):
    """``cta_pipeline`` on a symbolic token count (a 3-D input ``[2, s, h]``): one graph for every
    length, the op's result reshaped back with sizes taken from the graph."""
    be = Counting(inductor=False, passes=["cta_pipeline"], cost_model="off")
    c = torch.compile(_gelu_tp_mlp(fake_pg), backend=be, fullgraph=True)
    w1, b1, w2, b2 = torch.randn(32, 16), torch.randn(32), torch.randn(16, 32), torch.randn(16)
    with torch.no_grad():
        for s in (3, 5, 8):
            x = torch.randn(2, s, 16)
            torch._dynamo.mark_dynamic(x, 1)  # the tokens; the weights stay static, as parameters do
            assert c(x, w1, b1, w2, b2).shape == (2, s, 16)
    assert be.frames == 1, be.decisions()
    assert _has_symbolic_input(be.backend.graphs[0])
    assert OV.cta_pipeline_mlp.default in targets(be.backend.graphs[0]), be.decisions()
    assert [(p, ok) for _, p, ok, _ in be.decisions()] == [("cta_pipeline", True)]


def dynamic_cta_worker(rank, ws, lengths):
    import torch.distributed as dist

    group = dist.group.WORLD
    g = torch.Generator().manual_seed(0)
    w1 = torch.randn(64 * ws, 32, generator=g).chunk(ws)[rank].contiguous()  # column-parallel [F/ws, H]
    b1 = torch.randn(64 * ws, generator=g).chunk(ws)[rank].contiguous()
    w2 = torch.randn(32, 64 * ws, generator=g).chunk(ws, dim=1)[rank].contiguous()  # row-parallel [H, F/ws]
    b2 = torch.randn(32, generator=g) / ws
    f = _gelu_tp_mlp(group)
    be = Counting(inductor=False, passes=["cta_pipeline"], cost_model="off", lowering="p2p")
    c = torch.compile(f, backend=be, fullgraph=True)
    errs = []
    with torch.no_grad():
        for s in lengths:
            x = torch.randn(s, 32, generator=torch.Generator().manual_seed(s))
            torch._dynamo.mark_dynamic(x, 0)
            errs.append(_rel(c(x, w1, b1, w2, b2), f(x, w1, b1, w2, b2)))
    return errs, be.frames, be.decisions()


@pytest.mark.timeout(200)
def test_dynamic_cta_pipeline_gloo_matches_eager():
    for errs, frames, decisions in run_ranks(dynamic_cta_worker, 2, (5, 9, 16), timeout=180):
        assert frames == 1, decisions
        assert [(p, ok) for _, p, ok, _ in decisions] == [("cta_pipeline", True)], decisions
        assert all(e <= 1e-4 for e in errs), errs
