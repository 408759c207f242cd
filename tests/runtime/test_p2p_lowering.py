"""The p2p lowering against the plain collectives + matmul, on gloo ranks, random shapes.

Hypothesis draws the shapes inside every rank with ``derandomize=True`` and no shrinking, so all
ranks draw the same sequence of examples and stay in lockstep through the collectives.
"""

import pytest

from dist_harness import run_batch


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def ops_vs_collectives_worker(rank, ws, max_examples):
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    import overlap_backend  # noqa: F401  registers torch.ops.overlap

    group = dist.group.WORLD
    name = group.group_name
    all_gather = getattr(funcol, "all_gather_single", funcol.all_gather_tensor)
    reduce_scatter = getattr(funcol, "reduce_scatter_single", funcol.reduce_scatter_tensor)
    failures = []
    cfg = settings(
        max_examples=max_examples, derandomize=True, database=None, deadline=None,
        phases=[Phase.generate], suppress_health_check=list(HealthCheck),
    )

    def fresh(*shape, seed):
        # Same full tensor on every rank (a collective's inputs differ per rank through the rank index).
        return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))

    @cfg
    @given(
        lead=st.lists(st.integers(1, 5), min_size=0, max_size=2),
        rows=st.integers(1, 7), k=st.integers(1, 9), ns=st.lists(st.integers(1, 11), min_size=1, max_size=3),
        gather_dim=st.integers(0, 3), bias=st.booleans(), seed=st.integers(0, 2**16),
    )
    def check_ag_mm(lead, rows, k, ns, gather_dim, bias, seed):
        shape = [*lead, rows, k]
        gdim = gather_dim % len(shape)
        full_shape = list(shape)
        full_shape[gdim] *= ws
        full = fresh(*full_shape, seed=seed)
        shard = full.chunk(ws, dim=gdim)[rank].contiguous()
        kk = full_shape[-1]
        weights = [fresh(kk, n, seed=seed + 1 + i) for i, n in enumerate(ns)]
        biases = [fresh(n, seed=seed + 7 + i) if bias and i % 2 == 0 else None for i, n in enumerate(ns)]
        gathered, outs = torch.ops.overlap.ag_mm(shard, weights, biases, gdim, name, "p2p", True)
        ref_g = all_gather(shard, gdim, group)
        assert torch.equal(gathered, ref_g), "gathered tensor differs"
        for w, b, out in zip(weights, biases, outs):
            ref = ref_g.reshape(-1, kk) @ w + (0 if b is None else b)
            err = _rel(out, ref)
            if not err <= 1e-5:
                failures.append(("ag_mm", shape, gdim, err))

    @cfg
    @given(
        lead=st.lists(st.integers(1, 4), min_size=0, max_size=2), rows=st.integers(1, 4), k=st.integers(1, 9),
        n=st.integers(1, 4), scatter_dim=st.integers(0, 3), bias=st.booleans(),
        reduce_op=st.sampled_from(["sum", "avg", "max", "min"]), seed=st.integers(0, 2**16),
    )
    def check_mm_rs(lead, rows, k, n, scatter_dim, bias, reduce_op, seed):
        out_shape = [*lead, rows, n]
        sdim = scatter_dim % len(out_shape)
        out_shape[sdim] *= ws  # divisible by construction
        m = 1
        for s in out_shape[:-1]:
            m *= s
        a = fresh(ws, m, k, seed=seed)[rank]
        b = fresh(ws, k, out_shape[-1], seed=seed + 1)[rank]
        bv = fresh(ws, out_shape[-1], seed=seed + 2)[rank] if bias else None
        got = torch.ops.overlap.mm_rs(a, b, bv, out_shape, sdim, reduce_op, name, "p2p")
        full = (a @ b + (0 if bv is None else bv)).view(out_shape)
        ref = reduce_scatter(full, reduce_op, sdim, group)
        err = _rel(got, ref)
        if not (got.shape == ref.shape and err <= 1e-5):
            failures.append(("mm_rs", out_shape, sdim, reduce_op, err))

    @cfg
    @given(m=st.integers(ws, 13), k=st.integers(1, 9), n=st.integers(1, 9), bias=st.booleans(), seed=st.integers(0, 2**16))
    def check_mm_ar(m, k, n, bias, seed):
        a = fresh(ws, m, k, seed=seed)[rank]
        b = fresh(ws, k, n, seed=seed + 1)[rank]
        bv = fresh(ws, n, seed=seed + 2)[rank] if bias else None
        got = torch.ops.overlap.mm_ar(a, b, bv, "sum", name, "p2p")
        ref = funcol.all_reduce(a @ b + (0 if bv is None else bv), "sum", group)
        err = _rel(got, ref)
        if not (got.shape == ref.shape and err <= 1e-5):
            failures.append(("mm_ar", m, k, n, err))

    check_ag_mm()
    check_mm_rs()
    check_mm_ar()
    return failures


_RUNS: dict[int, dict] = {}


def _runs(ws: int) -> dict:
    """This file's workers at ``ws`` ranks in one process group (one start of the ranks and their imports);
    the symm fallback first, before any other call counts a path."""
    if ws not in _RUNS:
        calls = {"symm on gloo": (symm_on_gloo_worker, ())} if ws == 2 else {}
        calls["ops"] = (ops_vs_collectives_worker, (25,))
        _RUNS[ws] = run_batch(calls, ws, timeout=600)
    return _RUNS[ws]


@pytest.mark.timeout(700)
@pytest.mark.parametrize("ws", [2, 3, 4])
def test_p2p_ops_match_collectives(ws):
    per_rank = _runs(ws)["ops"].get()
    assert per_rank == [[]] * ws, per_rank


def symm_on_gloo_worker(rank, ws):
    import torch
    import torch.distributed as dist

    import overlap_backend  # noqa: F401
    from overlap_backend.runtime import symm
    from overlap_backend.runtime.symm import lowering_helpers

    torch.manual_seed(rank)
    name = dist.group.WORLD.group_name
    a, b = torch.randn(8, 16), torch.randn(16, 12)
    out = torch.ops.overlap.mm_ar(a, b, None, "sum", name, "symm")
    ref = a @ b
    dist.all_reduce(ref)
    return torch.allclose(out, ref, atol=1e-5), dict(lowering_helpers.PATHS), symm.group_support(name)


# Bad inputs (clear errors before any communication) are tested in-process, on the fake group of 4
# ranks: tests/e2e/test_reliability.py.


@pytest.mark.timeout(700)
def test_symm_on_gloo_falls_back_to_p2p():
    # A symm op on a CPU/gloo group runs on p2p, with the same result, on every rank.
    for ok, paths, why in _runs(2)["symm on gloo"].get():
        assert ok
        assert paths == {"mm_ar:p2p": 1}
        assert "not NCCL" in why
