"""Exact-graph tests of each pass, in one process with the fake process group (4 ranks).

Each test compiles a small function with ``OVERLAP_INDUCTOR=0`` and checks the rewritten graph:
which overlap ops it holds with which arguments, that the matched collectives and matmuls are
gone, and what the report says. Numerics are tested with real gloo ranks elsewhere.
"""

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

from overlap_backend import make_backend

all_gather = getattr(funcol, "all_gather_single", funcol.all_gather_tensor)
reduce_scatter = getattr(funcol, "reduce_scatter_single", funcol.reduce_scatter_tensor)
WS = 4
C10D = torch.ops._c10d_functional


def compile_and_run(fn, *args, **backend_kw):
    backend = make_backend(inductor=False, **backend_kw)
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    out = compiled(*args)
    return backend, out


def graph_ops(backend, index=0):
    """(target, node) pairs of call_function nodes in the ``index``-th graph the backend saw."""
    return backend.graphs[index]


def targets(graph):
    return [n.target for n in graph.nodes if n.op == "call_function"]


def only(graph, target):
    nodes = [n for n in graph.nodes if n.target is target]
    assert len(nodes) == 1, f"expected one {target}, got {len(nodes)}:\n{graph}"
    return nodes[0]


def applied(backend, pass_name):
    return [m for r in backend.reports for m in r.matches if m.pass_name == pass_name and m.applied]


def rejected(backend, pass_name):
    return [m for r in backend.reports for m in r.matches if m.pass_name == pass_name and not m.applied]


# ------------------------------------------------------------------------------------ ag_mm
def test_ag_dim0_2d(fake_pg, capture):
    def f(x, w):
        return all_gather(x, 0, fake_pg) @ w

    be, out = compile_and_run(f, torch.randn(8, 16), torch.randn(16, 32))
    g = be.graphs[0]
    op = only(g, torch.ops.overlap.ag_mm.default)
    shard, weights, biases, gather_dim, group_name, lowering, return_gathered = op.args
    assert gather_dim == 0 and lowering == "p2p" and return_gathered is False
    assert len(weights) == 1 and biases == [None] and group_name == fake_pg.group_name
    assert C10D.all_gather_into_tensor.default not in targets(g)
    assert torch.ops.aten.mm.default not in targets(g)
    assert out.shape == (8 * WS, 32)
    assert len(applied(be, "ag_mm")) == 1


def test_ag_dim1_3d_reshape_mm_reshape_and_qkv(fake_pg, capture):
    """Sequence-parallel gather (split/cat form) feeding Q, K, V projections through reshapes."""

    def f(x, wq, wk, wv, bq):
        g = all_gather(x, 1, fake_pg)
        return F.linear(g, wq, bq), g @ wk.t(), g @ wv.t()

    x = torch.randn(2, 3, 16)
    ws = [torch.randn(24, 16) for _ in range(3)]
    be, (q, k, v) = compile_and_run(f, x, *ws, torch.randn(24))
    g = be.graphs[0]
    op = only(g, torch.ops.overlap.ag_mm.default)
    assert op.args[3] == 1 and len(op.args[1]) == 3
    assert sum(b is not None for b in op.args[2]) == 1  # the addmm's bias travels with its weight
    for t in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.cat.default):
        assert t not in targets(g)
    assert q.shape == k.shape == v.shape == (2, 3 * WS, 24)


def test_ag_last_dim_contraction(fake_pg, capture):
    def f(x, w):
        return all_gather(x, 1, fake_pg) @ w

    be, out = compile_and_run(f, torch.randn(8, 4), torch.randn(4 * WS, 32))
    op = only(be.graphs[0], torch.ops.overlap.ag_mm.default)
    assert op.args[3] == 1 and out.shape == (8, 32)


def test_ag_result_also_used_elsewhere_is_returned(fake_pg, capture):
    def f(x, w):
        g = all_gather(x, 0, fake_pg)
        return g @ w, g.sum()

    be, _ = compile_and_run(f, torch.randn(8, 16), torch.randn(16, 32))
    op = only(be.graphs[0], torch.ops.overlap.ag_mm.default)
    assert op.args[6] is True  # the gathered tensor is still needed


def test_ag_rejected_when_weight_depends_on_gather(fake_pg, capture):
    def f(x):
        g = all_gather(x, 0, fake_pg)
        return g @ g[:16].t()

    be, _ = compile_and_run(f, torch.randn(8, 16))
    assert not applied(be, "ag_mm")
    (rej,) = rejected(be, "ag_mm")
    assert "depends on the gathered tensor" in rej.reason
    assert C10D.all_gather_into_tensor.default in targets(be.graphs[0])


def test_ag_without_matmul_reported(fake_pg, capture):
    be, _ = compile_and_run(lambda x: all_gather(x, 0, fake_pg) * 2, torch.randn(8, 16))
    (rej,) = rejected(be, "ag_mm")
    assert "no matmul" in rej.reason


def test_min_numel_rejects_small(fake_pg, capture):
    def f(x, w):
        return all_gather(x, 0, fake_pg) @ w

    be, _ = compile_and_run(f, torch.randn(8, 16), torch.randn(16, 32), min_numel=10**6)
    (rej,) = rejected(be, "ag_mm")
    assert "OVERLAP_MIN_NUMEL" in rej.reason


# ------------------------------------------------------------------------------------ mm_rs
@pytest.mark.parametrize("scatter_dim", [0, 1])
def test_mm_rs_2d(fake_pg, capture, scatter_dim):
    def f(a, b):
        return reduce_scatter(a @ b, "sum", scatter_dim, fake_pg)

    be, out = compile_and_run(f, torch.randn(16, 8), torch.randn(8, 32))
    op = only(be.graphs[0], torch.ops.overlap.mm_rs.default)
    _, _, bias, out_shape, sd, reduce_op, _, lowering = op.args
    assert bias is None and out_shape == [16, 32] and sd == scatter_dim and reduce_op == "sum"
    assert C10D.reduce_scatter_tensor.default not in targets(be.graphs[0])
    assert out.shape == ((16 // WS, 32) if scatter_dim == 0 else (16, 32 // WS))


def test_mm_rs_3d_sequence_parallel_with_bias(fake_pg, capture):
    def f(x, w, b):
        return reduce_scatter(F.linear(x, w, b), "avg", 1, fake_pg)

    be, out = compile_and_run(f, torch.randn(2, 8, 16), torch.randn(12, 16), torch.randn(12))
    op = only(be.graphs[0], torch.ops.overlap.mm_rs.default)
    assert op.args[2] is not None and op.args[3] == [2, 8, 12] and op.args[4] == 1 and op.args[5] == "avg"
    assert out.shape == (2, 2, 12)


def test_mm_rs_rejected_when_matmul_result_reused(fake_pg, capture):
    def f(a, b):
        y = a @ b
        return reduce_scatter(y, "sum", 0, fake_pg), y.sum()

    be, _ = compile_and_run(f, torch.randn(16, 8), torch.randn(8, 32))
    (rej,) = rejected(be, "mm_rs")
    assert "also used by" in rej.reason
    assert torch.ops.overlap.mm_rs.default not in targets(be.graphs[0])


def test_rs_of_non_matmul_reported(fake_pg, capture):
    be, _ = compile_and_run(lambda x: reduce_scatter(x * 2, "sum", 0, fake_pg), torch.randn(16, 8))
    (rej,) = rejected(be, "mm_rs")
    assert "not produced by a matmul" in rej.reason


def test_mm_rs_sum_of_matmuls_is_one_matmul_over_concatenated_k(fake_pg, capture):
    """The input gradient of Q/K/V in the backward of TP + SP: (gq @ Wq + gk @ Wk) + gv @ Wv on the
    3-D [b, s, h] layout, then the sequence reduce-scatter: one op on cat(g, 1) @ cat(W, 0)."""

    def f(gq, gk, gv, wq, wk, wv):
        return reduce_scatter(gq @ wq + gk @ wk + gv @ wv, "sum", 1, fake_pg)

    args = (torch.randn(2, 8, 12), torch.randn(2, 8, 4), torch.randn(2, 8, 4),
            torch.randn(12, 16), torch.randn(4, 16), torch.randn(4, 16))
    be, out = compile_and_run(f, *args)
    g = be.graphs[0]
    op = only(g, torch.ops.overlap.mm_rs.default)
    a, b, bias, out_shape, scatter_dim = op.args[:5]
    assert a.target is torch.ops.aten.cat.default and a.args[1] == 1 and len(a.args[0]) == 3
    assert b.target is torch.ops.aten.cat.default and b.args[1] == 0 and [n.op for n in b.args[0]] == ["placeholder"] * 3
    assert bias is None and out_shape == [2, 8, 16] and scatter_dim == 1
    ts = targets(g)
    assert torch.ops.aten.mm.default not in ts and torch.ops.aten.add.Tensor not in ts
    assert C10D.reduce_scatter_tensor.default not in ts
    (rec,) = applied(be, "mm_rs")
    assert sum(n.startswith("add") for n in rec.nodes) == 2 and sum(n.startswith("mm") for n in rec.nodes) == 3
    assert out.shape == (2, 2, 16)


def test_mm_rs_sum_of_matmuls_folded_into_addmm(fake_pg, capture):
    """Inductor's post-grad addmm fusion turns ``add(mm(a1, b1), mm(a2, b2))`` of 2-D activations into
    ``addmm(mm(a1, b1), a2, b2)`` (a full [M, N] "bias"): still a sum of matmuls (here nested twice)."""

    def f(a1, a2, a3, b1, b2, b3):
        return reduce_scatter(torch.addmm(torch.addmm(a1 @ b1, a2, b2), a3, b3), "sum", 0, fake_pg)

    args = (torch.randn(16, 6), torch.randn(16, 4), torch.randn(16, 2),
            torch.randn(6, 8), torch.randn(4, 8), torch.randn(2, 8))
    be, out = compile_and_run(f, *args)
    g = be.graphs[0]
    op = only(g, torch.ops.overlap.mm_rs.default)
    a, b, bias = op.args[:3]
    # placeholders in the order of first use: a1, b1, a2, b2, a3, b3
    assert a.target is torch.ops.aten.cat.default and [n.name for n in a.args[0]] == ["arg0_1", "arg2_1", "arg4_1"]
    assert b.target is torch.ops.aten.cat.default and [n.name for n in b.args[0]] == ["arg1_1", "arg3_1", "arg5_1"]
    assert bias is None
    ts = targets(g)
    assert torch.ops.aten.mm.default not in ts and torch.ops.aten.addmm.default not in ts
    assert out.shape == (4, 8)


@pytest.mark.parametrize("variant, reason", [
    ("residual", "not produced by a matmul"),  # a + b @ w: not a sum of matmuls
    ("bias", "addmm (bias) in a sum of matmuls"),
    ("reused", "also used by"),
])
def test_mm_rs_sum_of_matmuls_rejections(fake_pg, capture, variant, reason):
    def f(x1, x2, w1, w2, bias):
        y1 = x1 @ w1
        if variant == "residual":
            return reduce_scatter(x1[:, :8] + x2 @ w2, "sum", 0, fake_pg)
        if variant == "bias":
            return reduce_scatter(F.linear(x1, w1.t(), bias) + x2 @ w2, "sum", 0, fake_pg)
        return reduce_scatter(y1 + x2 @ w2, "sum", 0, fake_pg), y1.sum()

    be, _ = compile_and_run(f, torch.randn(16, 12), torch.randn(16, 4), torch.randn(12, 8), torch.randn(4, 8),
                            torch.randn(8))
    (rej,) = rejected(be, "mm_rs")
    assert reason in rej.reason, rej.reason
    assert torch.ops.overlap.mm_rs.default not in targets(be.graphs[0])


# ------------------------------------------------------------------------------------ mm_ar
def test_mm_ar_funcol_3d(fake_pg, capture):
    def f(x, w):
        return funcol.all_reduce(x @ w, "sum", fake_pg)

    be, out = compile_and_run(f, torch.randn(2, 5, 16), torch.randn(16, 8))
    g = be.graphs[0]
    op = only(g, torch.ops.overlap.mm_ar.default)
    assert op.args[3] == "sum" and C10D.all_reduce.default not in targets(g)
    assert out.shape == (2, 5, 8)


def test_mm_ar_inplace_c10d(fake_pg, capture):
    def f(x, w):
        y = x @ w
        dist.all_reduce(y)
        return y

    be, out = compile_and_run(f, torch.randn(8, 16), torch.randn(16, 8))
    only(be.graphs[0], torch.ops.overlap.mm_ar.default)
    assert out.shape == (8, 8)


def test_inplace_c10d_gather_and_scatter(fake_pg, capture):
    def f(x, w1, w2):
        full = torch.empty(8 * WS, 16)
        dist.all_gather_into_tensor(full, x)
        h = full @ w1
        out = torch.empty(8, 16)
        dist.reduce_scatter_tensor(out, h @ w2)
        return out

    be, out = compile_and_run(f, torch.randn(8, 16), torch.randn(16, 16), torch.randn(16, 16))
    g = be.graphs[0]
    only(g, torch.ops.overlap.ag_mm.default)
    only(g, torch.ops.overlap.mm_rs.default)
    assert out.shape == (8, 16)


def test_passes_toggle(fake_pg, capture):
    def f(x, w1, w2):
        return reduce_scatter(all_gather(x, 0, fake_pg) @ w1 @ w2, "sum", 0, fake_pg)

    args = (torch.randn(8, 16), torch.randn(16, 16), torch.randn(16, 16))
    be, _ = compile_and_run(f, *args, passes=["mm_rs"])
    assert {m.pass_name for r in be.reports for m in r.matches} == {"mm_rs"}
    assert torch.ops.overlap.ag_mm.default not in targets(be.graphs[0])
    only(be.graphs[0], torch.ops.overlap.mm_rs.default)


# --------------------------------------------------------------------------------- backward
def test_backward_graph_rewritten(fake_pg, capture):
    """Column-parallel + sequence-parallel linear: the backward reduce-scatters grad @ W."""

    def f(x, w):
        return F.gelu(all_gather(x, 1, fake_pg) @ w)

    x = torch.randn(2, 4, 16, requires_grad=True)
    w = torch.randn(16, 32, requires_grad=True)
    be = make_backend(inductor=False)
    out = torch.compile(f, backend=be)(x, w)
    out.sum().backward()
    kinds = {r.kind: r for r in be.reports}
    assert set(kinds) == {"forward", "backward"}
    assert any(m.applied and m.pass_name == "ag_mm" for m in kinds["forward"].matches)
    assert any(m.applied and m.pass_name == "mm_rs" for m in kinds["backward"].matches)
    bw = be.graphs[[r.kind for r in be.reports].index("backward")]
    only(bw, torch.ops.overlap.mm_rs.default)
    assert x.grad.shape == x.shape and w.grad.shape == w.shape


# ------------------------------------------------------------------- chains and odd layouts
def test_chained_all_reduces_both_rewritten(fake_pg, capture):
    def f(x, w1, w2):
        return funcol.all_reduce(funcol.all_reduce(x @ w1, "sum", fake_pg) @ w2, "sum", fake_pg)

    be, out = compile_and_run(f, torch.randn(8, 16), torch.randn(16, 16), torch.randn(16, 8))
    assert len(applied(be, "mm_ar")) == 2 and out.shape == (8, 8)
    assert sum(t is torch.ops.overlap.mm_ar.default for t in targets(be.graphs[0])) == 2


def test_chained_reduce_scatters_both_rewritten(fake_pg, capture):
    def f(x, w1, w2):
        return reduce_scatter(reduce_scatter(x @ w1, "sum", 0, fake_pg) @ w2, "sum", 0, fake_pg)

    be, out = compile_and_run(f, torch.randn(64, 16), torch.randn(16, 16), torch.randn(16, 8))
    assert len(applied(be, "mm_rs")) == 2 and out.shape == (4, 8)


def test_gathered_value_as_weight_of_another_gather(fake_pg, capture):
    def f(x, y, w):
        g1 = all_gather(x, 0, fake_pg)  # [16, 16]
        g2 = all_gather(y, 0, fake_pg)  # [8, 16]
        return g1 @ w, g2 @ g1

    be, (a, b) = compile_and_run(f, torch.randn(4, 16), torch.randn(2, 16), torch.randn(16, 8))
    assert len(applied(be, "ag_mm")) == 2 and a.shape == (16, 8) and b.shape == (8, 16)


def test_reordered_chunks_rejected(fake_pg, capture):
    """A cat that does not put rank r's chunk r-th is not an all_gather along that dim."""

    def f(x, w):
        g = torch.ops._c10d_functional.wait_tensor(
            torch.ops._c10d_functional.all_gather_into_tensor(x, WS, fake_pg.group_name)
        )
        pieces = list(g.split(2))
        return torch.cat(pieces[::-1], dim=1) @ w

    be, _ = compile_and_run(f, torch.randn(2, 8), torch.randn(8 * WS, 4))
    (rej,) = rejected(be, "ag_mm")
    assert "out of rank order" in rej.reason


def test_rs_through_flattening_reshape_rejected(fake_pg, capture):
    def f(a, b):
        return reduce_scatter((a @ b).view(-1), "sum", 0, fake_pg)

    be, out = compile_and_run(f, torch.randn(4, 8), torch.randn(8, 6))
    (rej,) = rejected(be, "mm_rs")
    assert "does not keep the matmul's rows" in rej.reason and out.shape == (6,)
