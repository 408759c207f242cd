"""The private CUDA graphs of eager symm calls (``runtime/symm/private_graphs.py``) on the CPU: CUDA's graph,
stream and capture calls replaced by fakes that record what a replay would write. What is checked: which
calls of a key run eagerly, capture or replay; that every call after a key's first uses the captured-call
protocol; that a replay never overwrites an output still referenced; that moved tensors, a moved data
buffer, a p2p key, a failed capture and the bounds are handled."""

from __future__ import annotations

import contextlib
import types

import pytest
import torch

from overlap_backend.runtime import lowering
from overlap_backend.runtime.symm import lowering_helpers, private_graphs, registry
from overlap_backend.spec import knobs


class FakeGraph:
    """A captured graph: the writes its capture recorded, run again on every replay."""

    active: "FakeGraph | None" = None
    replays = 0

    def __init__(self):
        self.writes = []

    def capture_begin(self, capture_error_mode="global"):
        assert capture_error_mode == "thread_local"
        FakeGraph.active = self

    def capture_end(self):
        FakeGraph.active = None

    def replay(self):
        FakeGraph.replays += 1
        for write in self.writes:
            write()


class FakeInput:
    """A CUDA tensor as the private graphs see it: an address and a storage."""

    is_cuda = True
    device = torch.device("cuda", 0)

    def __init__(self):
        self.t = torch.zeros(1)

    def data_ptr(self):
        return self.t.data_ptr()

    def untyped_storage(self):
        return self.t.untyped_storage()


class Op:
    """A symm implementation: out = value[0] everywhere; records the protocol each run used."""

    def __init__(self):
        self.value = [0.0]
        self.runs = []  # (protocol: captured-call?, inside a capture?)
        self.p2p = False
        self.fail_capture = False

    def __call__(self, x, group_name):
        captured = FakeGraph.active is not None
        self.runs.append((lowering_helpers.capturing(x), captured))
        if self.p2p:
            lowering_helpers.PATHS["fake_op:p2p"] += 1
        if captured and self.fail_capture:
            raise RuntimeError("operation not permitted when stream is capturing")
        out = torch.full((3,), self.value[0])
        if captured:
            FakeGraph.active.writes.append(lambda: out.fill_(self.value[0]))
        return out


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: FakeGraph.active is not None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: "compute")
    monkeypatch.setattr(torch.cuda, "Stream", lambda *a: "capture")
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    st = types.SimpleNamespace(data=object(), device=torch.device("cuda", 0), check_status=lambda: None)
    monkeypatch.setattr(registry, "states", {("g", 0): st})
    monkeypatch.setattr(private_graphs, "_graphs", type(private_graphs._graphs)())
    monkeypatch.setattr(private_graphs, "_capture_streams", {})
    FakeGraph.active, FakeGraph.replays = None, 0
    with knobs.symm.patch(PRIVATE_GRAPHS=True):
        yield st


def bind(op):
    return private_graphs.KeyGraphs("fake_op", op, lambda args: ([args[0]], args[1]))


def test_off_the_op_runs_as_it_is(fake_cuda):
    op, x = Op(), FakeInput()
    key = bind(op)
    with knobs.symm.patch(PRIVATE_GRAPHS=False):
        for _ in range(3):
            key(x, "g")
    assert op.runs == [(False, False)] * 3
    assert key.calls == 0 and not key.entries


def test_eager_then_capture_then_replays_with_fresh_values(fake_cuda):
    op, x = Op(), FakeInput()
    key = bind(op)
    op.value[0] = 1.0
    out = key(x, "g")  # the key's second call (its first ran unbound): eager, on the captured protocol
    assert op.runs == [(True, False)] and out.eq(1.0).all()
    del out
    op.value[0] = 2.0
    out = key(x, "g")  # captured, then replayed: the replay computed the output
    assert op.runs[-1] == (True, True) and FakeGraph.replays == 1 and out.eq(2.0).all()
    first = out.untyped_storage().data_ptr()
    del out
    for value in (3.0, 4.0, 5.0):
        op.value[0] = value
        out = key(x, "g")
        assert out.eq(value).all() and out.untyped_storage().data_ptr() == first
        del out
    assert len(op.runs) == 2 and FakeGraph.replays == 4 and len(key.entries) == 1 and key.replays == 3


def test_an_output_still_referenced_is_never_overwritten(fake_cuda):
    op, x = Op(), FakeInput()
    key = bind(op)
    key(x, "g")
    op.value[0] = 2.0
    held = key(x, "g")  # graph A's outputs, still held below
    view = held[1:]  # (a view counts too)
    del held
    op.value[0] = 3.0
    out = key(x, "g")  # A is busy: a second graph
    assert len(key.entries) == 2 and out.eq(3.0).all() and view.eq(2.0).all()
    del out
    op.value[0] = 4.0
    out = key(x, "g")  # the second graph again, A still busy
    assert out.eq(4.0).all() and view.eq(2.0).all() and len(key.entries) == 2
    del out, view
    op.value[0] = 5.0
    assert key(x, "g").eq(5.0).all()  # A free again: reused, nothing captured
    assert len(key.entries) == 2 and sum(captured for _, captured in op.runs) == 2


def test_new_addresses_run_eagerly_then_capture_and_a_moved_data_buffer_captures_again(fake_cuda):
    op, x, y = Op(), FakeInput(), FakeInput()
    key = bind(op)
    key(x, "g")
    key(x, "g")
    key(y, "g")  # other addresses, the first time: an eager run
    assert len(key.entries) == 1 and op.runs[-1] == (True, False)
    key(y, "g")  # the second time: another graph
    assert len(key.entries) == 2 and op.runs[-1] == (True, True)
    fake_cuda.data = object()  # the data buffer grew (moved): x's graph is stale
    op.value[0] = 7.0
    assert key(x, "g").eq(7.0).all()
    assert sum(captured for _, captured in op.runs) == 3 and len(key.entries) == 2  # (the stale one dropped)


def test_a_key_on_p2p_keeps_the_eager_protocol(fake_cuda):
    op, x = Op(), FakeInput()
    op.p2p = True
    key = bind(op)
    for _ in range(4):
        key(x, "g")
    assert key.plain and op.runs == [(True, False)] + [(False, False)] * 3 and not key.entries


def test_tensors_that_move_every_call_are_never_captured(fake_cuda):
    op = Op()
    key = bind(op)
    inputs = [FakeInput() for _ in range(7)]  # (all alive: distinct addresses)
    for x in inputs:
        key(x, "g")
    assert key.captures == 0 and not key.entries and op.runs == [(True, False)] * 7


def test_layers_that_come_back_are_replayed(fake_cuda):
    """A model's layers: one key, one set of addresses per layer, every step: eager, capture, then replays."""
    op = Op()
    key = bind(op)
    layers = [FakeInput() for _ in range(10)]
    key(layers[0], "g")  # (the key's first call ran before the binding)
    for step in range(3):
        for x in layers:
            key(x, "g")
    # step 0: layer 0 captured (its warm-up saw it), the rest eager; step 1: layer 0 replayed, the rest captured
    assert key.captures == 10 and key.replays == 11 and not key.capture_off and len(key.entries) == 10


def test_more_layers_than_the_bound_holds_stop_the_captures(fake_cuda):
    op = Op()
    key = bind(op)
    layers = [FakeInput() for _ in range(3)]
    with knobs.symm.patch(PRIVATE_GRAPH_CAPTURES_MIN=3, PRIVATE_GRAPHS_PER_KEY=2):
        for step in range(6):
            for x in layers:
                key(x, "g")
        assert key.capture_off and key.evictions == 3
        captures = key.captures
        for x in layers:
            key(x, "g")  # the graphs left still replay; the other layers run eagerly, on the captured protocol
    assert key.captures == captures and len(key.entries) <= 2 and (True, False) in op.runs[-3:]


def test_the_process_bound_evicts_the_least_recently_used_idle_graph(fake_cuda):
    keys, x = [bind(Op()) for _ in range(3)], FakeInput()
    with knobs.symm.patch(PRIVATE_GRAPHS_MAX=2):
        for key in keys:
            key(x, "g")
            key(x, "g")
        assert [len(k.entries) for k in keys] == [0, 1, 1] and len(private_graphs._graphs) == 2
        held = keys[1](x, "g")  # a replay; keys[1]'s graph busy while held
        keys[0](x, "g")  # evicts keys[2]'s (idle, least recently used after keys[1]'s replay)
        assert [len(k.entries) for k in keys] == [1, 1, 0]
        keys[2](x, "g")  # no idle graph left (keys[0]'s is idle again: evicted)
        assert [len(k.entries) for k in keys] == [0, 1, 1] and held.numel() == 3


def test_a_failed_capture_runs_the_call_without_a_graph(fake_cuda):
    op, x = Op(), FakeInput()
    op.fail_capture = True
    key = bind(op)
    key(x, "g")
    op.value[0] = 2.0
    out = key(x, "g")
    assert out.eq(2.0).all() and key.capture_off and FakeGraph.active is None
    assert op.runs == [(True, False), (True, True), (True, False)]


def test_the_symm_gemm_ops_bind_their_tensors():
    """ops.py caches ``lowering.bound(impl)`` per key: the symm GEMM ops bind KeyGraphs over every tensor."""
    w, b, e = torch.zeros(4, 2), torch.zeros(2), torch.zeros(3, 2)
    shard = torch.zeros(3, 4)
    ag = lowering.bound(lowering.implementation("symm", "ag_mm"))
    assert isinstance(ag, private_graphs.KeyGraphs)
    tensors, group = ag.inputs((shard, [w, w], [b, None], 0, "tp", True, [], [e]))
    assert [id(t) for t in tensors] == [id(shard), id(w), id(w), id(b), id(e)] and group == "tp"
    rs = lowering.bound(lowering.implementation("symm", "mm_rs"))
    tensors, group = rs.inputs((shard, w, None, [3, 2], 0, "sum", "tp", "", [e]))
    assert [id(t) for t in tensors] == [id(shard), id(w), id(e)] and group == "tp"
    ar = lowering.bound(lowering.implementation("symm", "mm_ar"))
    tensors, group = ar.inputs((shard, w, b, "sum", "tp", "", ()))
    assert [id(t) for t in tensors] == [id(shard), id(w), id(b)] and group == "tp"
    from overlap_backend.runtime import cta_symm  # noqa: F401  registers the symm cta_pipeline_mlp

    cta = lowering.bound(lowering.implementation("symm", "cta_pipeline_mlp"))
    tensors, group = cta.inputs((shard, w, b, None, None, w, None, "gelu", "none", 2, "tp"))
    assert [id(t) for t in tensors] == [id(shard), id(w), id(b), id(w)] and group == "tp"
    # cta_pipeline_mlp lays its weights out on the host (cta_weights): their versions are part of the key, so
    # a weight changed in place is never served by a graph that replays the old placement
    before = cta.values((shard, w, b, None, None, w, None, "gelu", "none", 2, "tp"))
    w.mul_(0.5)
    assert cta.values((shard, w, b, None, None, w, None, "gelu", "none", 2, "tp")) != before
    assert lowering.bound(lowering.implementation("p2p", "mm_ar")) is lowering.implementation("p2p", "mm_ar")
    assert lowering.bound(rs.impl) is not rs  # one state per key


def test_destroying_a_process_group_drops_every_private_graph(fake_cuda):
    """The buffers a graph captured go with their group: the destroy hook forgets every private graph."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import overlap_backend  # noqa: F401  installs the hook

    key, x = bind(Op()), FakeInput()
    key(x, "g")
    key(x, "g")
    assert len(key.entries) == 1 and len(private_graphs._graphs) == 1
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    dist.destroy_process_group()
    assert not key.entries and not private_graphs._graphs


def test_the_memory_bound_drops_idle_graphs_before_capturing_more(fake_cuda):
    """Each fake graph holds 12 bytes of outputs; a 20-byte bound keeps two (the second goes over it)."""
    keys, x = [bind(Op()) for _ in range(3)], FakeInput()
    with knobs.symm.patch(PRIVATE_GRAPHS_MAX_MIB=20 / 2**20):
        for key in keys[:2]:
            key(x, "g")
            key(x, "g")
        assert [len(k.entries) for k in keys] == [1, 1, 0] and private_graphs._held_mib() == 24 / 2**20
        held = keys[1](x, "g")  # keys[1]'s graph busy; keys[0]'s is the least recently used idle one
        keys[2](x, "g")
        keys[2](x, "g")
        assert [len(k.entries) for k in keys] == [0, 1, 1] and held.numel() == 3
        keys[0](x, "g")  # both graphs over the bound: keys[2]'s (idle) is dropped, keys[1]'s held one stays
        assert [len(k.entries) for k in keys] == [1, 1, 0]


def test_a_knob_change_forgets_the_graphs_captured_under_the_old_values(fake_cuda):
    op, x = Op(), FakeInput()
    key = bind(op)
    for value in (1.0, 2.0, 3.0):  # eager, capture, replay
        op.value[0] = value
        del_out = key(x, "g")
        del del_out
    assert len(key.entries) == 1 and key.replays == 1 and len(private_graphs._graphs) == 1
    runs = len(op.runs)
    with knobs.cta.patch(K_CHUNKS=knobs.cta.K_CHUNKS + 1):  # a graph bakes in what the knobs chose
        op.value[0] = 4.0
        out = key(x, "g")
        assert len(op.runs) == runs + 1 and op.runs[-1] == (True, False), "the old graph replayed"
        assert out.eq(4.0).all() and not key.entries and not private_graphs._graphs
        del out
        op.value[0] = 5.0
        out = key(x, "g")  # its addresses seen again under the new values: captured
        assert op.runs[-1] == (True, True) and out.eq(5.0).all() and len(key.entries) == 1
