"""Reliability: bad op inputs fail before any transfer, a late or dead peer becomes an
exception within OVERLAP_TIMEOUT_S, graph breaks inside a pattern are reported, and recompiles
reuse the lowerings' per-group state.

In-process tests use the fake process group (no communication) or a one-rank gloo group (real ops,
real numerics); the multi-process checks share one spawn of 2 gloo ranks (``gloo_results``).
"""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

from dist_harness import run_ranks

TIMEOUT_S = 2.0  # OVERLAP_TIMEOUT_S of the timeout test
SLACK_S = 10.0  # what the loaded 2-core CI machine may add on top of it


# ------------------------------------------------------------------------------ input validation
def _no_transfer(monkeypatch):
    """Make any p2p transfer fail the test: a validation error must come before the first one."""
    from overlap_backend.runtime import p2p

    def start_batch(ops):
        raise AssertionError("a transfer started before the inputs were validated")

    monkeypatch.setattr(p2p, "start_batch", start_batch)


def _bad_calls(name):
    ov = torch.ops.overlap
    f16 = torch.float16
    x, w = torch.randn(4, 8), torch.randn(8, 16)
    a, b = torch.randn(8, 4), torch.randn(4, 16)
    wg = torch.randn(2, 8, 6)
    wd = torch.randn(2, 6, 8)
    rows = torch.arange(4)
    return [
        # (op, call, argument named, expected text)
        ("ag_mm", lambda: ov.ag_mm(x, [torch.randn(7, 16)], [None], 0, name, "p2p", False), "weights[0]", "K=8"),
        ("ag_mm", lambda: ov.ag_mm(x, [w.to(f16)], [None], 0, name, "p2p", False), "weights[0]", "dtype torch.float32"),
        ("ag_mm", lambda: ov.ag_mm(x, [w], [torch.randn(15)], 0, name, "p2p", False), "biases[0]", "[16] vector"),
        ("ag_mm", lambda: ov.ag_mm(x, [w], [None], 2, name, "p2p", False), "gather_dim", "out of range"),
        ("ag_mm", lambda: ov.ag_mm(x.long(), [w.long()], [None], 0, name, "p2p", False), "shard", "floating-point"),
        ("ag_mm", lambda: ov.ag_mm(x, [w], [None], 0, "no-such-group", "p2p", False), "group_name", "not a process group"),
        ("mm_rs", lambda: ov.mm_rs(torch.randn(6, 4), b, None, [6, 16], 0, "sum", name, "p2p"), "out_shape",
         "not divisible by the group size 4"),
        ("mm_rs", lambda: ov.mm_rs(a, b, None, [4, 16], 0, "sum", name, "p2p"), "out_shape", "multiply to M=8"),
        ("mm_rs", lambda: ov.mm_rs(a, torch.randn(5, 16), None, [8, 16], 0, "sum", name, "p2p"), "b", "[K=4, N]"),
        ("mm_rs", lambda: ov.mm_rs(a, b, None, [8, 16], 0, "mean", name, "p2p"), "reduce_op", "allowed: sum"),
        ("mm_ar", lambda: ov.mm_ar(a, b.to(torch.float64), None, "sum", name, "p2p"), "b", "dtype torch.float32"),
        ("mm_ar", lambda: ov.mm_ar(a.view(2, 4, 4), b, None, "sum", name, "p2p"), "a", "2-D"),
        ("mm_ar", lambda: ov.mm_ar(a, b, torch.randn(16, 1), "sum", name, "p2p"), "bias", "[16] vector"),
        ("mm_ar", lambda: ov.mm_ar(a, b, None, "sum", name, "p2p", "gelu|gelu"), "epilogue", "specs for 1 outputs"),
        ("moe_experts", lambda: ov.moe_experts(x, [1, 1, 2], [1, 1, 2], rows, None, [2, 2], wg, wg, wd, name, "p2p",
                                               [False] * 5), "send_splits", "expected 4 sizes"),
        ("moe_experts", lambda: ov.moe_experts(x, [1, 1, 1, 1], [1, 1, 1, 1], rows, None, [2, 2], wg, wg.to(f16), wd,
                                               name, "p2p", [False] * 5), "w_up", "dtype"),
        ("moe_experts", lambda: ov.moe_experts(x, [1, 1, 1, 1], [1, 2, 1, 1], rows, None, [2, 2], wg, wg, wd, name,
                                               "p2p", [False] * 5), "recv_splits", "sends itself 1 rows but receives 2"),
        ("cta_pipeline_mlp", lambda: ov.cta_pipeline_mlp(x, w, None, w, None, torch.randn(16, 8), None, "gelu", "none", 2,
                                                         name, "p2p"), "w3", "exactly when activation is 'swiglu'"),
        ("cta_pipeline_mlp", lambda: ov.cta_pipeline_mlp(x, w, None, None, None, torch.randn(12, 8), None, "gelu", "none",
                                                         2, name, "p2p"), "w2", "[F=16, N]"),
        ("cta_pipeline_mlp", lambda: ov.cta_pipeline_mlp(x, w, None, None, None, torch.randn(16, 8), None, "gelu", "none",
                                                         0, name, "p2p"), "stages", ">= 1"),
    ]


def test_bad_inputs_raise_before_any_transfer(fake_pg, monkeypatch):
    from overlap_backend.runtime.checks import OverlapInputError
    from overlap_backend.spec.epilogue import EpilogueError

    _no_transfer(monkeypatch)
    for op, call, arg, text in _bad_calls(fake_pg.group_name):
        with pytest.raises((OverlapInputError, EpilogueError)) as info:
            call()
        msg = str(info.value)
        assert msg.startswith(f"overlap::{op}: argument {arg!r}"), msg
        assert text in msg, msg


def test_unknown_lowering_names_the_registered_ones(fake_pg, monkeypatch):
    from overlap_backend.runtime.lowering import LoweringError

    _no_transfer(monkeypatch)
    with pytest.raises(LoweringError, match="overlap::mm_ar has no 'nvshmem' lowering; lowerings that implement it: p2p, symm"):
        torch.ops.overlap.mm_ar(torch.randn(4, 8), torch.randn(8, 4), None, "sum", fake_pg.group_name, "nvshmem")


def test_unknown_group_is_a_group_error(fake_pg):
    from overlap_backend.runtime.checks import OverlapGroupError

    with pytest.raises(OverlapGroupError, match="'nope' is not a process group of this process"):
        torch.ops.overlap.mm_ar(torch.randn(4, 4), torch.randn(4, 4), None, "sum", "nope", "p2p")
    # a rank outside a subgroup: c10d gives it no group object to name
    import torch.distributed as dist

    assert dist.new_group([0, 2]) is dist.GroupMember.NON_GROUP_MEMBER


@pytest.fixture
def gloo_one_rank():
    """A real one-rank gloo group: the ops run for real (ring of one), numerics can be checked."""
    import torch.distributed as dist

    torch._dynamo.reset()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()
        torch._dynamo.reset()


def test_non_contiguous_inputs_are_accepted(gloo_one_rank):
    """No layout is rejected (layout is rank-local): the lowerings copy what must be contiguous."""
    ov, name = torch.ops.overlap, gloo_one_rank.group_name
    x = torch.randn(3, 8, 5).transpose(1, 2)  # [3, 5, 8], not contiguous
    w = torch.randn(16, 8).t()  # [8, 16], a transposed view
    bias = torch.randn(32)[::2]  # strided [16]
    g, (out,) = ov.ag_mm(x, [w], [bias], 1, name, "p2p", True)
    torch.testing.assert_close(g, x)
    torch.testing.assert_close(out, x.reshape(-1, 8) @ w + bias)
    a = torch.randn(8, 15).t()  # [15, 8] non-contiguous, viewed as [3, 5, 8] by mm_rs
    out = ov.mm_rs(a, w, None, [3, 5, 16], 1, "sum", name, "p2p")
    torch.testing.assert_close(out, (a @ w).view(3, 5, 16))
    torch.testing.assert_close(ov.mm_ar(a, w, bias, "sum", name, "p2p"), a @ w + bias)


# -------------------------------------------------------------------- per-group state, recompiles
def test_recompile_reuses_p2p_group_state(fake_pg, clean_env):
    """A second compiled graph (a recompile on a new shape) runs on the same per-group state."""
    import torch.distributed._functional_collectives as funcol

    import overlap_backend
    from overlap_backend.runtime import p2p

    def f(x, w):
        return funcol.all_gather_tensor(x, 0, fake_pg) @ w

    backend = overlap_backend.make_backend(inductor=False, passes=["ag_mm"], lowering="p2p")
    compiled = torch.compile(f, backend=backend)
    w = torch.randn(8, 16)
    compiled(torch.randn(2, 8), w)
    state = p2p._GROUPS[fake_pg.group_name]
    calls = state.calls
    compiled(torch.randn(3, 8), w)  # new shape: recompiles
    compiled(torch.randn(5, 8), w)
    graphs = [r for r in backend.reports if any(m.applied for m in r.matches)]
    assert len(graphs) >= 2, [r.to_json() for r in backend.reports]
    assert list(p2p._GROUPS) == [fake_pg.group_name]
    assert p2p._GROUPS[fake_pg.group_name] is state
    assert state.calls == calls + 2


def test_p2p_group_state_follows_the_group(clean_env):
    """A destroyed group's state is dropped; a new group under the same name gets fresh state."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from overlap_backend.runtime import p2p

    states = []
    for _ in range(2):
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
        try:
            name = dist.group.WORLD.group_name
            states.append(p2p.group_state(name))
            assert p2p.group_state(name) is states[-1]
            assert states[-1].group is dist.group.WORLD
        finally:
            dist.destroy_process_group()
        assert name not in p2p._GROUPS
    assert states[0] is not states[1]


def test_timeout_is_read_once_per_group(clean_env):
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from overlap_backend.runtime import p2p

    clean_env.setenv("OVERLAP_TIMEOUT_S", "7.5")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        st = p2p.group_state(dist.group.WORLD.group_name)
        assert st.timeout_s == 7.5 and st.timeout.total_seconds() == 7.5
    finally:
        dist.destroy_process_group()


def test_symm_view_cache_is_bounded(monkeypatch):
    """GroupState.data_view caches one view per (dtype, shape, offset): bounded, for dynamic shapes."""
    from types import SimpleNamespace

    from overlap_backend.runtime import cuda as _cuda
    from overlap_backend.runtime import symm
    from overlap_backend.spec import knobs

    monkeypatch.setattr(_cuda, "as_tensor", lambda ptr, nbytes, dev: torch.empty(nbytes, dtype=torch.uint8))
    st = object.__new__(symm.GroupState)
    st.data, st.device, st._views = SimpleNamespace(nbytes=1 << 20, local=0), torch.device("cpu"), {}
    first = st.data_view(torch.float32, (4, 8))
    assert st.data_view(torch.float32, (4, 8)) is first  # reused
    for rows in range(1, 3 * knobs.symm.MAX_VIEWS):
        st.data_view(torch.bfloat16, (rows, 64))
        assert len(st._views) <= knobs.symm.MAX_VIEWS


def test_cta_placements_of_dead_weights_are_pruned():
    from overlap_backend.runtime import cta_weights

    live, dead = torch.randn(4, 4), torch.randn(4, 4)
    saved = dict(cta_weights.placements)
    try:
        cta_weights.placements.clear()
        cta_weights.placements["live"] = cta_weights.Placement((cta_weights.storage_ref(live),), (0,), w1=live.clone())
        cta_weights.placements["dead"] = cta_weights.Placement((cta_weights.storage_ref(dead),), (0,), w1=dead.clone())
        del dead
        assert cta_weights.prune_placements() == 1
        assert list(cta_weights.placements) == ["live"]
    finally:
        cta_weights.placements.clear()
        cta_weights.placements.update(saved)


# ------------------------------------------- gloo, 2 ranks: graph breaks, recompiles, late and dead peers
def _graph_breaks_and_recompiles(rank, debug_dir):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    import overlap_backend
    from overlap_backend.runtime import p2p

    pg = dist.group.WORLD
    torch.manual_seed(0)
    w = torch.randn(8, 16)

    def ag_break_mm(x):
        g = funcol.all_gather_tensor(x, 0, pg)
        torch._dynamo.graph_break()
        return g @ w

    def mm_break_rs(a):
        y = a @ w
        torch._dynamo.graph_break()
        return funcol.reduce_scatter_tensor(y, "sum", 0, pg)

    def ag_mm(x):
        return funcol.all_gather_tensor(x, 0, pg) @ w

    backend = overlap_backend.make_backend(inductor=False, debug_dir=debug_dir, lowering="p2p")
    errs = {}
    x = torch.randn(4, 8) + rank
    for fn in (ag_break_mm, mm_break_rs):
        errs[fn.__name__] = (torch.compile(fn, backend=backend)(x) - fn(x)).abs().max().item()
    # recompiles: a new shape is a new graph; the p2p state of the group is the one created first
    compiled = torch.compile(ag_mm, backend=backend)
    ids = []
    for rows in (2, 3, 6):
        x = torch.randn(rows, 8) + rank
        errs[f"ag_mm_{rows}"] = (compiled(x) - ag_mm(x)).abs().max().item()
        ids.append(id(p2p._GROUPS[pg.group_name]))
    return {"errs": errs, "state_ids": ids, "groups": list(p2p._GROUPS),
            "reports": [r.to_json() for r in backend.reports]}


def _late_and_dead_peers(rank, timeout_s):
    import torch.distributed as dist

    from overlap_backend.runtime.p2p import P2PError

    # A short timeout, read by groups created from now on (the state of WORLD, used while the ranks
    # compiled at different speeds above, keeps the default 60 s).
    os.environ["OVERLAP_TIMEOUT_S"] = str(timeout_s)
    name = dist.new_group([0, 1]).group_name
    x, w = torch.randn(4, 8), torch.randn(8, 16)
    result = {}
    # 1. a late peer: rank 1 skips the call; rank 0 must give up after OVERLAP_TIMEOUT_S
    dist.barrier()
    if rank == 0:
        start = time.monotonic()
        try:
            torch.ops.overlap.ag_mm(x, [w], [None], 0, name, "p2p", False)
            result["late"] = None
        except P2PError as e:
            result["late"] = (time.monotonic() - start, str(e))
    else:
        time.sleep(timeout_s + 2)  # alive, but never makes its side of the transfer
    # 2. a dead peer, on a fresh group (the timeout closed the first one's connections): rank 1 leaves
    sub = dist.new_group([0, 1])
    if rank == 0:
        start = time.monotonic()
        try:
            torch.ops.overlap.mm_ar(torch.randn(8, 4), torch.randn(4, 4), None, "sum", sub.group_name, "p2p")
            result["dead"] = None
        except P2PError as e:
            result["dead"] = (time.monotonic() - start, str(e))
    return result  # rank 1 returns at once: its process exits while rank 0 waits for it


def gloo_worker(rank, ws, debug_dir, timeout_s):
    out = _graph_breaks_and_recompiles(rank, debug_dir)
    out["disagreement"] = _disagreeing_ranks(rank, ws)  # on a group of its own
    out.update(_late_and_dead_peers(rank, timeout_s))  # last: it leaves the group broken
    return out


@pytest.fixture(scope="module")
def gloo_results(tmp_path_factory):
    """One spawn of 2 gloo ranks for the multi-process checks below (spawning costs most of the time)."""
    debug_dir = tmp_path_factory.mktemp("dumps")
    out = run_ranks(gloo_worker, 2, str(debug_dir), TIMEOUT_S, timeout=200)
    return out, debug_dir


@pytest.mark.timeout(240)
def test_graph_break_inside_a_pattern_is_reported(gloo_results):
    out, debug_dir = gloo_results
    for rank, res in enumerate(out):
        assert res["errs"]["ag_break_mm"] < 1e-4 and res["errs"]["mm_break_rs"] < 1e-4, res["errs"]
        matches = [m for r in res["reports"] for m in r["matches"]]
        ag = [m for m in matches if m["pass"] == "ag_mm" and not m["applied"]]
        rs = [m for m in matches if m["pass"] == "mm_rs" and not m["applied"]]
        assert ag and "graph break" in ag[0]["reason"] and "output of this graph" in ag[0]["reason"], matches
        assert rs and "graph break" in rs[0]["reason"] and "input of this graph" in rs[0]["reason"], matches
        summary = json.loads((debug_dir / f"rank{rank}" / "summary.json").read_text())
        reasons = [m["reason"] for g in summary["graphs"] for m in g["matches"] if not m["applied"]]
        assert sum("graph break" in why for why in reasons) == 2, summary


@pytest.mark.timeout(240)
def test_recompiles_reuse_the_p2p_group_state_on_gloo(gloo_results):
    out, _ = gloo_results
    for res in out:
        assert all(res["errs"][f"ag_mm_{rows}"] < 1e-4 for rows in (2, 3, 6)), res["errs"]
        assert len(set(res["state_ids"])) == 1, res["state_ids"]
        matches = [m for r in res["reports"] for m in r["matches"]]
        assert sum(m["pass"] == "ag_mm" and m["applied"] for m in matches) >= 2, matches  # each recompile rewritten


@pytest.mark.timeout(240)
def test_late_or_dead_peer_raises_within_the_timeout(gloo_results):
    out, _ = gloo_results
    late, dead = out[0]["late"], out[0]["dead"]
    assert late is not None and dead is not None, out[0]
    elapsed, msg = late
    assert TIMEOUT_S - 0.5 <= elapsed <= TIMEOUT_S + SLACK_S, late
    assert "overlap p2p: ag_mm on rank 0" in msg and f"OVERLAP_TIMEOUT_S={TIMEOUT_S:g} s" in msg, msg
    elapsed, msg = dead
    assert elapsed <= TIMEOUT_S + SLACK_S, dead
    assert "overlap p2p: mm_ar on rank 0" in msg, msg


# ---------------------------------------------------------------- watchdog of the symm stream waits
class _Progress:
    """What the compute stream wrote into the two host-mapped words: (started, finished)."""

    def __init__(self):
        self.started = self.finished = 0

    def __call__(self):
        return self.started, self.finished


def test_watchdog_counts_from_when_a_call_is_seen_started_and_fires_until_it_finishes():
    from overlap_backend.runtime import watchdog

    fired, progress = [], _Progress()
    w = watchdog.Watched(1.0, progress, lambda what, waited: fired.append((what, round(waited, 3))),
                         lambda epoch: {7: "ag_mm", 8: "mm_rs"}[epoch])
    progress.started = progress.finished = 6
    w.poll(100.0)
    w.poll(200.0)  # idle (or the GPU still busy with earlier work): nothing counts
    assert fired == []
    progress.started = 7  # the compute stream reached call 7
    w.poll(300.0)
    w.poll(300.9)
    assert fired == []
    w.poll(301.5)
    w.poll(302.0)  # fires on every poll until the call finishes (flags may be lowered again)
    assert fired == [("ag_mm", 1.5), ("ag_mm", 2.0)]
    progress.finished = 7
    w.poll(400.0)
    progress.started = 8  # the next call starts: its own clock
    w.poll(400.5)
    w.poll(401.2)
    assert len(fired) == 2
    w.poll(401.6)
    assert fired[-1] == ("mm_rs", 1.1)


def test_watchdog_thread_runs_on_overdue_and_survives_its_errors():
    from overlap_backend.runtime import watchdog
    from overlap_backend.spec import knobs

    seen, progress = [], _Progress()

    def on_overdue(what, waited):
        seen.append(what)
        if len(seen) == 1:
            raise RuntimeError("first release failed")  # logged; the thread must go on

    progress.started = 1
    w = watchdog.watch(0.1, progress, on_overdue, lambda epoch: "moe_experts")
    try:
        deadline = time.monotonic() + 10
        while len(seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert seen[:2] == ["moe_experts", "moe_experts"], seen
        progress.finished = 1
        time.sleep(3 * knobs.runtime.WATCHDOG_POLL_S)
        n = len(seen)
        time.sleep(3 * knobs.runtime.WATCHDOG_POLL_S)
        assert len(seen) == n
    finally:
        watchdog.unwatch(w)


def test_watchdog_bounds_captured_replays_too():
    """Captured calls count their replays in GRAPH_STARTED / GRAPH_FINISHED (a kernel; a stream
    write's value would be baked in): the watchdog sees a replay in flight like an eager call, and
    names it as one; eager epochs and replay counts add up."""
    from overlap_backend.runtime import symm, watchdog
    from overlap_backend.spec import symm_layout

    st = object.__new__(symm.GroupState)
    st.status = [0] * 16
    st._names = [""] * 64
    st._count_replays = True
    st._names[5] = "mm_rs"
    st.status[symm_layout.STARTED] = st.status[symm_layout.FINISHED] = 5  # eager calls 1..5 done
    st.status[symm_layout.GRAPH_STARTED], st.status[symm_layout.GRAPH_FINISHED] = 3, 2  # the third replay in flight
    started, finished = st._calls_in_flight()
    assert (started, finished) == (8, 7) and "CUDA-graph replay" in st._call_name(started)
    seen = []
    w = watchdog.Watched(1.0, st._calls_in_flight, lambda what, s: seen.append(what), st._call_name)
    w.poll(0.0)
    w.poll(1.5)
    assert seen == ["a captured symm call (CUDA-graph replay)"]
    st.status[symm_layout.GRAPH_FINISHED] = 3
    st.status[symm_layout.STARTED] = 6  # then an eager call in flight: named by its epoch
    st._names[6] = "ag_mm"
    assert st._calls_in_flight() == (9, 8) and st._call_name(9) == "ag_mm"
    st._count_replays = False  # replay counting turned off (its kernel failed): only eager calls count
    st.status[symm_layout.GRAPH_STARTED] = 4
    assert st._calls_in_flight() == (6, 5)
    # the status buffer's watchdog words
    assert symm_layout.STARTED < symm_layout.FINISHED < symm_layout.GRAPH_STARTED < symm_layout.GRAPH_FINISHED < 16


def test_overdue_symm_call_releases_flags_and_the_next_call_raises(monkeypatch):
    """GroupState._overdue (watchdog thread): the group is marked unusable with a message naming the
    op, rank, group and timeout; every poll releases the flags again; a kernel's own report (status
    word) wins over the watchdog's message."""
    from overlap_backend.runtime import symm
    from overlap_backend.runtime.symm import diagnostics
    from overlap_backend.spec import symm_layout

    st = object.__new__(symm.GroupState)
    st.rank, st.ws, st.group_name, st.timeout_ns, st.stalled = 1, 2, "tp", int(2e9), None
    st.status = [0] * symm_layout.STATUS_WORDS
    released = []
    monkeypatch.setattr(st, "_release_flags", lambda tell_peers: released.append(tell_peers), raising=False)
    st.check_status()
    st._overdue("ag_mm", 2.8)
    st._overdue("ag_mm", 2.85)
    assert released == [True, False]  # the peers are told once (see test_graph_flags.py)
    with pytest.raises(symm.SymmTimeoutError) as e:
        st.check_status()
    msg = str(e.value)
    assert "ag_mm on rank 1 of group 'tp'" in msg and "2.8 s" in msg and "OVERLAP_TIMEOUT_S=2" in msg, msg
    st.status[:7] = [1, 0, 1, 3, 0, 5, 1]  # a kernel timed out too: its report names the flag
    monkeypatch.setattr(diagnostics, "_resolve_process_group", lambda name: type("G", (), {"size": lambda self: 2})())
    with pytest.raises(symm.SymmTimeoutError, match="on flag 3"):
        st.check_status()


def test_destroying_the_default_group_frees_cudagraph_trees_first(clean_env, monkeypatch):
    """pytorch#115388: destroy_process_group hangs while CUDA graphs that captured NCCL work are alive
    (the symm ops' p2p fallback is captured under mode="reduce-overhead"): the hook frees the
    cudagraph trees before the default group is destroyed, and not for a subgroup."""
    import torch.distributed as dist
    from torch._inductor import cudagraph_trees
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import overlap_backend  # noqa: F401  installs the hook
    from overlap_backend.runtime.symm import registry

    order = []
    monkeypatch.setattr(cudagraph_trees, "reset_cudagraph_trees", lambda: order.append("graphs freed"))
    monkeypatch.setattr(registry, "release_all", lambda: order.append("symm released"))
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        sub = dist.new_group([0, 1])
        dist.destroy_process_group(sub)
        assert order == []
    finally:
        dist.destroy_process_group()
    assert order == ["graphs freed", "symm released"]


def test_watchdog_thread_stops_at_exit_after_the_symm_release():
    """The watchdog's atexit hook stops its thread (not left inside a CUDA call while the context
    goes away), and runs after symm.release_all (registered before it), which may need it."""
    from overlap_backend.runtime import watchdog
    from overlap_backend.runtime.symm import registry

    w = watchdog.watch(60.0, lambda: (0, 0), lambda *a: None)
    try:
        assert watchdog._thread is not None and watchdog._thread.is_alive()
        watchdog._shutdown()
        assert not watchdog._thread.is_alive()
    finally:
        watchdog.unwatch(w)
        watchdog._stop.clear()
    # atexit runs last-registered first: symm's process hooks import the watchdog (registering its hook)
    # before they register release_all
    src = open(registry.__file__).read()
    assert src.index("from .. import watchdog") < src.index("atexit.register(release_all)")


def test_group_runs_unwatched_if_the_progress_write_is_refused(monkeypatch, caplog):
    """Should the driver refuse a stream write into pinned host memory, the ops go on (warned once)
    without the watchdog instead of failing."""
    from overlap_backend.runtime import cuda as _cuda
    from overlap_backend.runtime import symm, watchdog
    from overlap_backend.spec import symm_layout

    st = object.__new__(symm.GroupState)
    st.status_ptr, st.epoch, st.group_name, st._watch_progress = 4096, 3, "tp", True
    st._watched = watchdog.watch(60.0, lambda: (0, 0), lambda *a: None)
    calls = []

    def refuse(addr, value, stream):
        calls.append((addr, value))
        raise _cuda.CudaError("cuStreamWriteValue32 failed: CUDA_ERROR_NOT_SUPPORTED")

    monkeypatch.setattr(_cuda, "write_value32", refuse)
    with caplog.at_level("WARNING", logger="overlap_backend.symm"):
        st._progress(symm_layout.STARTED, None)
        st._progress(symm_layout.FINISHED, None)
    assert calls == [(4096 + 4 * symm_layout.STARTED, 3)]  # tried once, then off
    assert not st._watch_progress and st._watched not in watchdog._watched
    assert "without the stream-wait watchdog" in caplog.text


def test_a_peer_found_dead_when_a_transfer_starts_is_a_p2p_error(monkeypatch):
    """gloo raises at a send whose connection the dead peer closed (before any wait): the ring turns
    that into the same P2PError, naming the op and the peers, as a failed wait."""
    from types import SimpleNamespace

    from overlap_backend.runtime import p2p

    def refused(ops):
        raise RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:30336")

    monkeypatch.setattr(p2p, "start_batch", refused)
    ring = object.__new__(p2p.Ring)
    ring.state = SimpleNamespace(name="g", size=2, timeout_s=2.0)
    ring.op, ring.rank, ring.next, ring.prev, ring._cuda = "mm_ar", 0, 1, 1, False
    op = SimpleNamespace(tensor=torch.zeros(1))
    with pytest.raises(p2p.P2PError, match=r"mm_ar on rank 0 of group 'g'.*starting a ring step's transfers.*"
                                           r"Connection closed by peer"):
        ring.start([op])


def test_gloo_group_refuses_cuda_tensors_before_any_transfer(gloo_one_rank, monkeypatch):
    """gloo sends CPU tensors only (a CUDA tensor aborts the process inside gloo): a ring of a gloo
    group given CUDA tensors raises a P2PError saying so, before starting any transfer."""
    from types import SimpleNamespace

    from overlap_backend.runtime import p2p

    started = []
    monkeypatch.setattr(p2p, "start_batch", lambda ops: started.append(ops) or [])
    ring = p2p.Ring(gloo_one_rank.group_name, op="ag_mm")
    assert ring.state.cpu_only
    ring.start([SimpleNamespace(tensor=torch.zeros(1))])  # CPU tensors go through
    assert len(started) == 1
    with pytest.raises(p2p.P2PError, match=r"ag_mm on rank 0 .*gloo cannot send CUDA tensors point to point"):
        ring.start([SimpleNamespace(tensor=SimpleNamespace(is_cuda=True))])
    assert len(started) == 1


def test_gloo_group_with_cuda_tensors_leaves_the_collective_alone(gloo_one_rank, monkeypatch):
    """A pass whose op would end on p2p with CUDA tensors over a gloo group (which runs collectives on
    CUDA tensors but cannot send them point to point) rejects the match instead of writing an op that
    would raise; CPU tensors are rewritten as before; a backend with a CUDA side (``cpu:gloo,cuda:nccl``)
    is not refused."""
    from types import SimpleNamespace

    import torch.distributed as dist

    from overlap_backend.passes import Rejected, lowerings
    from overlap_backend.runtime import p2p, symm

    name = gloo_one_rank.group_name
    for lowering in ("auto", "p2p", "symm"):
        ctx = SimpleNamespace(config=SimpleNamespace(lowering=lowering))
        expected = "p2p" if lowering == "auto" else lowering  # auto: symm does not serve gloo (no CUDA here)
        assert lowerings.choose_lowering(ctx, name, "cpu") == expected
        with pytest.raises(Rejected, match="gloo cannot send CUDA tensors point to point"):
            lowerings.choose_lowering(ctx, name, "cuda")
    assert not p2p.sends_cuda_tensors(gloo_one_rank)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "cpu:gloo,cuda:nccl")
    assert p2p.sends_cuda_tensors(gloo_one_rank)
    assert lowerings.choose_lowering(SimpleNamespace(config=SimpleNamespace(lowering="p2p")), name, "cuda") == "p2p"
    # a gloo group symm serves (tests sharing one GPU: knobs.symm.GROUP_BACKENDS) keeps symm
    monkeypatch.undo()
    monkeypatch.setattr(symm, "group_support", lambda group_name: None)
    assert lowerings.choose_lowering(SimpleNamespace(config=SimpleNamespace(lowering="auto")), name, "cuda") == "symm"


def test_one_rank_group_is_reported_as_such(gloo_one_rank):
    """On a group of one rank there is nothing to overlap: the gather is reported with that reason,
    whatever reads the gathered tensor (it used to say that no matmul reads it, when a norm did)."""
    import torch.distributed._functional_collectives as funcol

    from overlap_backend import make_backend

    name = gloo_one_rank.group_name
    w = torch.randn(8, 16)

    def f(x):
        g = funcol.wait_tensor(funcol.all_gather_tensor(x, 0, name))
        return torch.nn.functional.rms_norm(g, (8,)) @ w, g.sum()  # a norm, then a matmul; and a sum

    be = make_backend(inductor=False)
    x = torch.randn(4, 8)
    out = torch.compile(f, backend=be, fullgraph=True)(x)
    recs = [m for r in be.reports for m in r.matches if m.pass_name == "ag_mm"]
    assert recs and all(not m.applied and "has 1 rank: nothing to overlap" in m.reason for m in recs), recs
    torch.testing.assert_close(out[0], torch.nn.functional.rms_norm(x, (8,)) @ w)  # left as it was: still right


# ------------------------------------------------------------------------- rank disagreement
def _disagreeing_ranks(rank, ws):
    import torch.distributed as dist

    from overlap_backend.runtime.checks import OverlapDisagreementError

    name = dist.new_group(list(range(ws))).group_name
    w = torch.randn(8, 16)
    out = {}
    cases = {
        # rank 1 has a longer sequence
        "rows": lambda: torch.ops.overlap.ag_mm(torch.randn(4 + rank, 8), [w], [None], 0, name, "p2p", False),
        # rank 1 runs in bfloat16
        "dtype": lambda: torch.ops.overlap.mm_ar(torch.randn(8, 4).to(torch.bfloat16 if rank else torch.float32),
                                                 torch.randn(4, 4).to(torch.bfloat16 if rank else torch.float32),
                                                 None, "sum", name, "p2p"),
        "mm_rs rows": lambda: torch.ops.overlap.mm_rs(torch.randn(4 + 2 * rank, 4), torch.randn(4, 6), None,
                                                      [4 + 2 * rank, 6], 0, "sum", name, "p2p"),
        # MoE: rank 1's tokens are wider / it holds one expert more / its backward's experts are wider
        "moe hidden": lambda: _moe_call(name, rank, h=8 + 8 * rank),
        "moe experts": lambda: _moe_call(name, rank, experts=2 + rank),
        "moe backward": lambda: _moe_backward_call(name, rank, f=4 + 4 * rank),
        # CTA: rank 1 has more tokens (x is replicated in tensor parallelism) / another GELU
        "cta rows": lambda: _cta_call(name, m=3 + rank),
        "cta approximate": lambda: _cta_call(name, approximate=("none", "tanh")[rank]),
        # MoE token rows and splits are per-rank (dropless routing): rank 0 sends [2, 3], rank 1 [3, 1]
        "moe rows differ": lambda: _moe_call(name, rank, send=([2, 3], [3, 1])[rank], recv=([2, 3], [3, 1])[rank]),
        "moe backward rows differ": lambda: _moe_backward_call(name, rank, send=([2, 3], [3, 1])[rank],
                                                               recv=([2, 3], [3, 1])[rank]),
    }
    for case, call in cases.items():
        try:
            call()
            out[case] = None
        except OverlapDisagreementError as e:
            out[case] = str(e)
    # the group stays usable, and an agreeing call runs (its key checked once, then cached)
    t = torch.ones(2)
    dist.all_reduce(t, group=dist.group.WORLD)
    x = torch.randn(4, 8)
    for _ in range(2):
        torch.ops.overlap.ag_mm(x, [w], [None], 0, name, "p2p", False)
    out["after"] = t.tolist()
    return out


def _moe_call(name, rank, h=8, experts=2, send=(2, 2), recv=(2, 2)):
    """``moe_experts`` on p2p with SwiGLU experts of width 4; each rank's split sizes as given."""
    x = torch.randn(sum(send), h)
    m = sum(recv)
    w = [torch.randn(experts, h, 4), torch.randn(experts, h, 4), torch.randn(experts, 4, h)]
    offsets = torch.tensor([m * (e + 1) // experts for e in range(experts)], dtype=torch.int32)
    return torch.ops.overlap.moe_experts(x, list(send), list(recv), torch.arange(m), offsets, [], *w, name, "p2p",
                                         [False] * 5)


def _moe_backward_call(name, rank, f=4, send=(2, 2), recv=(2, 2)):
    grad, m = torch.randn(sum(send), 8), sum(recv)
    wt = [torch.randn(2, f, 8), torch.randn(2, f, 8), torch.randn(2, 8, f)]
    return torch.ops.overlap.moe_experts_backward(grad, list(send), list(recv), torch.arange(m), None,
                                                  [m // 2, m - m // 2], torch.randn(m, f), torch.randn(m, f), *wt,
                                                  name, "p2p")


def _cta_call(name, m=3, approximate="none"):
    x = torch.randn(m, 8)
    return torch.ops.overlap.cta_pipeline_mlp(x, torch.randn(8, 4), None, None, None, torch.randn(4, 6), None, "gelu",
                                              approximate, 2, name, "p2p")


@pytest.mark.timeout(240)
def test_rank_disagreement_raises_on_every_rank(gloo_results):
    for rank, out in enumerate(res["disagreement"] for res in gloo_results[0]):
        for case, op, arg in (("rows", "ag_mm", "'shard'"), ("dtype", "mm_ar", "'a'"), ("mm_rs rows", "mm_rs", "'a'"),
                              ("moe hidden", "moe_experts", "'x'"), ("moe experts", "moe_experts", "'w_gate'"),
                              ("moe backward", "moe_experts_backward", "'gate'"), ("cta rows", "cta_pipeline_mlp", "'x'"),
                              ("cta approximate", "cta_pipeline_mlp", "'approximate'")):
            msg = out[case]
            assert msg is not None, (rank, case, "no error: the ranks ran on disagreeing inputs")
            assert msg.startswith(f"overlap::{op}:") and arg in msg and "disagree" in msg, (rank, case, msg)
        # per-rank token rows of a MoE op are no disagreement
        assert out["moe rows differ"] is None and out["moe backward rows differ"] is None, out
        assert "'x'" not in out["moe experts"] and "'w_up'" in out["moe experts"], out["moe experts"]
        assert out["after"] == [2.0, 2.0]
