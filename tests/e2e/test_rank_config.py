"""Ranks that compile with different backend configurations are refused at compile time, before any
communication of the backend's own, on 2 gloo ranks: one rank disabled, another ``OVERLAP_MIN_NUMEL``,
another knob, a rank that never compiles with the backend; a peer that records the same configuration late
(its latest one another) is waited for. After each refusal the group still works."""

from __future__ import annotations

import time

import pytest

from dist_harness import run_ranks

TIMEOUT_S = 1.0  # OVERLAP_TIMEOUT_S of the compiles that are refused (the wait is that long)
LATE_TIMEOUT_S = 60.0  # of the compile whose peer records its configuration late


def _group_usable() -> bool:
    import torch
    import torch.distributed as dist

    t = torch.ones(2)
    dist.all_reduce(t)
    return t.tolist() == [2.0, 2.0]


def _traced():
    """(gm, inputs): all-gather -> mm as Dynamo hands it to a backend (captured once, run once on every rank)."""
    import torch
    import torch.distributed as dist

    seen = []

    def capture(gm, inputs):
        seen.append((gm, inputs))
        return gm.forward

    w = torch.randn(8, 16)
    name = dist.group.WORLD.group_name
    torch.compile(lambda x: torch.ops._c10d_functional.wait_tensor(
        torch.ops._c10d_functional.all_gather_into_tensor(x, 2, name)) @ w, backend=capture)(torch.randn(4, 8))
    return seen[0]


def rank_config_worker(rank, ws):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import overlap_backend
    from overlap_backend import rank_config
    from overlap_backend.spec import knobs

    knobs.runtime.set(RANK_CONFIG_MIN_WAIT_S=0.0)  # (on every rank: the knobs are part of the configuration)
    out = {}
    gm, inputs = _traced()

    def compile_with(**overrides):
        """What compiling ``gm`` with these overrides raised (None: it compiled), and in how many seconds."""
        backend = overlap_backend.make_backend(**{"inductor": False, "cost_model": "off", "timeout_s": TIMEOUT_S,
                                                  **overrides})
        t0 = time.monotonic()
        try:
            backend(gm, inputs)
            return None, time.monotonic() - t0
        except rank_config.RankConfigMismatchError as e:
            return str(e), time.monotonic() - t0

    # rank 1 has not compiled anything with the backend yet: rank 0 waits for it, then says so
    if rank == 0:
        out["absent"] = compile_with()
    dist.barrier()
    # the same configuration: agreed
    out["same"] = compile_with()
    # a recompile on one rank only (a guard that failed there): agreed at once, the peer is not waited for
    if rank == 0:
        out["alone"] = compile_with()
    dist.barrier()
    # another OVERLAP_MIN_NUMEL on rank 1: refused on both ranks, the group untouched
    out["min_numel"] = compile_with(min_numel=1 + rank)
    out["min_numel usable"] = _group_usable()
    # another knob on rank 1
    with knobs.cta.patch(K_CHUNKS=5 + rank):  # (neither the default)
        out["knob"] = compile_with()
    out["knob usable"] = _group_usable()
    # rank 1 disabled: it compiles plain Inductor (here: not run) and only records that; rank 0 compiles with a
    # configuration rank 1 never had (an earlier compile with the same one would have agreed)
    if rank == 1:
        from torch._inductor import compile_fx as cfx

        real, cfx.compile_fx = cfx.compile_fx, lambda gm, inputs, **kw: gm.forward  # Inductor itself is not tested
        try:
            out["disabled"] = compile_with(disable=True)
        finally:
            cfx.compile_fx = real
    else:
        out["disabled"] = compile_with(min_numel=5)
    dist.barrier()
    out["disabled usable"] = _group_usable()
    # a configuration no rank had before; rank 1 records it 1 s later (its latest is still "disabled"): waited for
    if rank == 1:
        time.sleep(1.0)
    out["late"] = compile_with(min_numel=7, timeout_s=LATE_TIMEOUT_S)
    # a real compile after all that: agreed, rewritten, and as eager
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))
    w = torch.randn(8, 16, generator=torch.Generator().manual_seed(7))
    gather = lambda t: torch.ops._c10d_functional.wait_tensor(  # noqa: E731
        torch.ops._c10d_functional.all_gather_into_tensor(t, ws, dist.group.WORLD.group_name))
    backend = overlap_backend.make_backend(inductor=False, cost_model="off")
    got = torch.compile(lambda t: F.gelu(gather(t) @ w), backend=backend)(x)
    out["compiled"] = (float((got - F.gelu(gather(x) @ w)).abs().max()),
                       [(m.pass_name, m.applied) for r in backend.reports for m in r.matches])
    return out


@pytest.fixture(scope="module")
def results():
    return run_ranks(rank_config_worker, 2, timeout=240)


def test_a_rank_that_never_compiles_with_the_backend_is_named_within_the_timeout(results):
    msg, seconds = results[0]["absent"]
    assert msg is not None and f"rank 1: no compile with backend='overlap' within {TIMEOUT_S:g} s" in msg, msg
    assert TIMEOUT_S <= seconds < TIMEOUT_S + 10, seconds


def test_ranks_with_the_same_configuration_compile(results):
    msg, seconds = results[0]["alone"]
    assert msg is None and seconds < TIMEOUT_S, results[0]["alone"]
    for out in results:
        assert out["same"][0] is None and out["late"][0] is None, out
        err, decisions = out["compiled"]
        assert err < 1e-5 and ("ag_mm", True) in decisions, out["compiled"]


@pytest.mark.parametrize("case, says", [("min_numel", "OVERLAP_MIN_NUMEL = 2 (this rank: 1)"),
                                        ("knob", "knobs (overlap_backend.spec.knobs) = ")])
def test_another_value_on_one_rank_is_refused_on_every_rank_before_any_communication(results, case, says):
    for rank, out in enumerate(results):
        msg, seconds = out[case]
        assert msg is not None and "the ranks of process group '0' compile with different configurations" in msg, msg
        other = 1 - rank
        assert f"rank {other}, its latest compile: " in msg and f"this is rank {rank}" in msg, msg
        if rank == 0:
            assert says in msg, msg
        assert seconds < TIMEOUT_S + 10, seconds
        assert out[f"{case} usable"] is True


def test_a_disabled_rank_is_named_by_the_others(results):
    msg, _ = results[0]["disabled"]
    assert msg is not None and "rank 1: OVERLAP_DISABLE=1" in msg, msg
    assert results[1]["disabled"][0] is None  # the disabled rank compiles plain, as without the backend
    assert all(out["disabled usable"] is True for out in results)
