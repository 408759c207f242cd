"""Private CUDA graphs of eager symm calls (``ag_mm``, ``mm_rs``, ``mm_ar``, ``cta_pipeline_mlp``,
``moe_experts``): one graph launch per steady-state call.

Outside CUDA graphs a symm call pays for its Python, its driver calls (stream memory operations,
copies, joins) and its launches on every call, several times what Inductor's GEMM + NCCL call costs
on the host. From the third call of an argument key on (the key ``ops.py`` caches its checks under),
a call replays a CUDA graph of the op captured for the call's tensor addresses instead, and returns
that graph's outputs. A graph is captured the second time a set of addresses comes (a model's layers
share a key and come back every step), so tensors that move on every call cost no capture.

What every rank must agree on is the flag protocol, not the graph: each call of a key after its first
uses the captured-call protocol (the toggling flag block, ``symm_layout.GRAPH_BLOCK``), whether this
rank replays a graph, captures one and replays it, or runs the op without a graph (the second call of
a key, which warms the captured path up eagerly, and any call no graph can serve). Which of those a
rank does is its own decision: addresses and liveness differ between ranks.

A graph serves a call when the call's tensors are at the addresses it was captured with, the group's
data buffer has not moved since, and no graph output it returned before is still referenced (a replay
overwrites them). The outputs are tensors of the graph's private memory pool, returned as new tensor
objects over the same storage so that their references can be counted.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable

import torch
from torch import Tensor

from ...spec import knobs
from . import registry
from .lowering_helpers import PATHS, protocol

log = logging.getLogger("overlap_backend.symm")

# every private graph of the process, least recently used first (bounded by knobs.symm.PRIVATE_GRAPHS_MAX)
_graphs: OrderedDict[int, "_Captured"] = OrderedDict()
_capture_streams: dict[int, torch.cuda.Stream] = {}
STATS = {"replays": 0, "captures": 0, "eager": 0, "evicted": 0}  # of this process (tests and benchmarks read it)


def _use_count(storage) -> int:
    return torch._C._storage_Use_Count(storage._cdata)


class _Captured:
    """One graph of one key: its addresses, its outputs and their storages' reference counts when idle."""

    __slots__ = ("graph", "ptrs", "state", "data", "outputs", "storages", "idle", "owner", "nbytes", "__weakref__")

    def __init__(self, graph, ptrs, state, outputs, owner):
        self.graph, self.ptrs, self.state, self.data, self.owner = graph, ptrs, state, state.data, owner
        self.outputs = outputs
        flat = _flatten(outputs)
        self.storages = [t.untyped_storage() for t in flat]
        self.idle = [_use_count(s) for s in self.storages]
        self.nbytes = sum(s.nbytes() for s in self.storages)

    def free(self) -> bool:
        """No output this graph returned is referenced any more (only this object's own references)."""
        for s, n in zip(self.storages, self.idle):
            if _use_count(s) != n:
                return False
        return True

    def valid(self, st) -> bool:
        return self.state is st and self.data is st.data


def _flatten(out) -> list[Tensor]:
    if isinstance(out, Tensor):
        return [out]
    return [t for part in out for t in _flatten(part)]


def _detached(out):
    """``out``'s structure over new tensor objects (same storage): what a replay returns."""
    if isinstance(out, Tensor):
        return out.detach()
    return type(out)(_detached(part) for part in out)


def _capture_stream(device: torch.device) -> torch.cuda.Stream:
    stream = _capture_streams.get(device.index)
    if stream is None:
        stream = _capture_streams[device.index] = torch.cuda.Stream(device)
    return stream


def _held_mib() -> float:
    """The outputs every private graph holds in its pool, in MiB (what the graphs keep from other tensors)."""
    return sum(e.nbytes for e in _graphs.values()) / 2**20


def _drop(entry: _Captured) -> None:
    """Forget ``entry``: its memory pool goes back to the allocator, so its last replay must have finished
    (once per eviction, never in a steady state that graphs serve)."""
    torch.cuda.synchronize(entry.state.device)
    _graphs.pop(id(entry), None)
    entry.owner.entries.remove(entry)
    entry.owner.evictions += 1
    STATS["evicted"] += 1


class KeyGraphs:
    """The symm implementation ``impl`` of ``op`` bound to one argument key: the key's call count and graphs.
    ``inputs(args)`` gives the call's tensors (whose addresses a graph is captured for) and its group name."""

    __slots__ = ("op", "impl", "inputs", "values", "calls", "entries", "seen", "captures", "replays", "evictions",
                 "plain", "capture_off", "generation")

    def __init__(self, op: str, impl: Callable, inputs: Callable, values: Callable | None = None):
        """``values(args)``: the host values a graph bakes in that the key does not fix (moe_experts' token
        splits and row counts, which differ between ranks and calls): a graph serves only calls with the same."""
        self.op, self.impl, self.inputs, self.values = op, impl, inputs, values
        self.calls = 0  # calls of this key after the first (which ran before this object existed)
        self.entries: list[_Captured] = []
        # addresses of the key's calls that no graph served, most recent last: a graph is captured for a set of
        # addresses seen before (a model's layers come back each step; tensors that move every call never do)
        self.seen: OrderedDict[tuple, None] = OrderedDict()
        self.captures = self.replays = self.evictions = 0
        self.plain = False  # the key runs on p2p: no graph, and the eager protocol
        self.capture_off = False  # graphs did not pay (or could not be captured) for this key: eager runs
        self.generation = knobs.generation()  # the knobs' values its graphs and decisions were made under

    def __call__(self, *args, **kwargs):
        if kwargs:  # (moe_experts' comm_sms: part of the key)
            return self._call(args, lambda *a: self.impl(*a, **kwargs))
        return self._call(args, self.impl)

    def _call(self, args, impl):
        if self.generation != knobs.generation():
            self._start_over()
        if self.plain or not knobs.symm.PRIVATE_GRAPHS:
            return impl(*args)
        tensors, group_name = self.inputs(args)
        if not tensors[0].is_cuda or torch.cuda.is_current_stream_capturing():
            return impl(*args)  # (a caller's capture: that graph is the one launch)
        self.calls += 1
        ptrs = tuple([t.data_ptr() for t in tensors])
        if self.values is not None:
            ptrs += self.values(args)
        if self.calls == 1:  # warm the captured protocol up eagerly (tuning, buffer growth, kernel loads)
            self._saw(ptrs)
            p2p = PATHS[f"{self.op}:p2p"]
            out = self._eager(impl, args)
            self.plain = PATHS[f"{self.op}:p2p"] != p2p  # the same on every rank: p2p is chosen by shapes
            return out
        st = registry.states.get((group_name, tensors[0].device.index))
        if st is None:
            return self._eager(impl, args)
        st.check_status()
        stale = None
        for entry in self.entries:
            if entry.ptrs == ptrs and entry.free():
                if not entry.valid(st):
                    stale = entry
                    break
                st.host_graph_call = self.op
                entry.graph.replay()
                _graphs.move_to_end(id(entry))
                self.replays += 1
                STATS["replays"] += 1
                return _detached(entry.outputs)
        if stale is not None:
            _drop(stale)
        if self.capture_off or ptrs not in self.seen or not self._room():
            self._saw(ptrs)
            return self._eager(impl, args)
        return self._capture(impl, args, ptrs, st, tensors)

    def _start_over(self) -> None:
        """Forget the graphs and decisions of this key: a knob changed since (a graph bakes in the kernels,
        paths and configs the knobs chose), so the next call is the key's first again."""
        if self.entries:
            torch.cuda.synchronize()
        for entry in self.entries:
            _graphs.pop(id(entry), None)
        self.entries.clear()
        self.seen.clear()
        self.calls = self.captures = self.replays = self.evictions = 0
        self.plain = self.capture_off = False
        self.generation = knobs.generation()

    def _saw(self, ptrs: tuple) -> None:
        self.seen[ptrs] = None
        self.seen.move_to_end(ptrs)
        if len(self.seen) > 2 * knobs.symm.PRIVATE_GRAPHS_PER_KEY:
            self.seen.popitem(last=False)

    def _eager(self, impl, args):
        STATS["eager"] += 1
        with protocol(graph=True):
            return impl(*args)

    def _room(self) -> bool:
        """Room for one more graph of this key: under both bounds, after dropping idle graphs where needed.
        A key whose graphs did not pay (evicted again and again, replayed less often than captured: more sets
        of addresses come back than the bounds hold) stops capturing."""
        if self.evictions >= knobs.symm.PRIVATE_GRAPH_CAPTURES_MIN and self.replays < self.captures:
            self.capture_off = True
            log.info("overlap symm: %s: private CUDA graphs off for a key (%d captures, %d evictions, %d replays): "
                     "more sets of its tensors' addresses come back than the bounds (knobs.symm.PRIVATE_GRAPHS_*) "
                     "hold", self.op, self.captures, self.evictions, self.replays)
            return False
        if len(self.entries) >= knobs.symm.PRIVATE_GRAPHS_PER_KEY:
            idle = next((e for e in self.entries if e.free()), None)
            if idle is None:
                return False
            _drop(idle)
        while len(_graphs) >= knobs.symm.PRIVATE_GRAPHS_MAX or _held_mib() >= knobs.symm.PRIVATE_GRAPHS_MAX_MIB:
            idle = next((e for e in _graphs.values() if e.free()), None)
            if idle is None:
                return False
            _drop(idle)
        return True

    def _capture(self, impl, args, ptrs, st, tensors):
        graph = torch.cuda.CUDAGraph()
        caller = torch.cuda.current_stream(tensors[0].device)
        try:
            with torch.cuda.stream(_capture_stream(tensors[0].device)):
                graph.capture_begin(capture_error_mode="thread_local")
                st.private_capture = True
                try:
                    with protocol(graph=True):
                        out = impl(*args)
                finally:
                    st.private_capture = False
                    graph.capture_end()
        except Exception as e:  # noqa: BLE001 - this call then runs without a graph (same protocol)
            self.capture_off = True
            log.warning("overlap symm: %s: capturing a private CUDA graph failed (%s: %s); the key runs without one",
                        self.op, type(e).__name__, e)
            return self._eager(impl, args)
        inputs = {t.untyped_storage().data_ptr() for t in tensors}
        if any(t.untyped_storage().data_ptr() in inputs for t in _flatten(out)):
            self.capture_off = True  # an output over an input's memory: a graph cannot own it
            return self._eager(impl, args)
        entry = _Captured(graph, ptrs, st, out, self)
        self.entries.append(entry)
        _graphs[id(entry)] = entry
        self.captures += 1
        STATS["captures"] += 1
        st.host_graph_call = self.op
        with torch.cuda.stream(caller):
            graph.replay()  # (not counted as a replay: the rule of ``_room`` counts the graphs' reuse)
        return _detached(out)


def forget() -> None:
    """Drop every private graph (process groups destroyed: their buffers go)."""
    if _graphs:
        torch.cuda.synchronize()
    for entry in list(_graphs.values()):
        entry.owner.entries.clear()
    _graphs.clear()


registry.on_destroy.append(forget)
