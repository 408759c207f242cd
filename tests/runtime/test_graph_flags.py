"""The toggling flag block of captured ``symm`` calls (``symm_layout.GRAPH_BLOCK``), checked by simulation.

Inside a CUDA graph a stream memory operation's value is fixed, so captured calls raise flags to 1,
wait for >= 1 and reset them to 0 once consumed (``GroupState.begin(graph=True)`` / ``end``). These
tests drive the real ``GroupState.begin`` / ``push`` / ``end`` of every rank with fake streams that
record the operations, add what the kernels do (raise done flags, wait for arrivals), queue several
replays back to back, then execute all ranks' streams in random orders (each stream in order;
``wait_stream`` as a join). Every wait must be released by a raise *of the same call* (a stale flag
left over from the previous replay would release it early) and no order may deadlock.
"""

from __future__ import annotations

import contextlib
import ctypes
import random
from types import SimpleNamespace

import pytest
import torch

from overlap_backend.runtime import cuda as _cuda
from overlap_backend.runtime import symm
from overlap_backend.runtime.symm import diagnostics, group, support
from overlap_backend.spec import knobs, symm_layout

FLAG_SPAN = 1 << 20  # fake flag buffer address of rank p: p * FLAG_SPAN


class FakeStream:
    def __init__(self, rank: int, name: str):
        self.rank, self.name, self.ops, self.done = rank, name, [], 0

    def wait_stream(self, other: "FakeStream") -> None:
        self.ops.append(("join", other, len(other.ops)))


class Sim:
    """Every rank's memory (word -> (value, call that raised it)) and its recorded streams."""

    def __init__(self, ws: int):
        self.ws = ws
        self.reset_memory()
        self.call = [0] * ws  # the replay each rank is enqueuing
        self.current_rank = 0
        names = ("compute", "push", "copy", *(f"push to {p}" for p in range(ws)))  # (per-peer push streams)
        self.streams = [{n: FakeStream(r, n) for n in names} for r in range(ws)]

    def reset_memory(self) -> None:
        """Every word 0, but PEER_OK (1 from the group's setup: no peer gave up)."""
        self.mem = [{symm_layout.PEER_OK: (1, None)} for _ in range(self.ws)]

    # the runtime's CUDA calls, recorded on the stream they are queued on
    def write_value32(self, addr, value, stream):
        stream.ops.append(("write", addr // FLAG_SPAN, (addr % FLAG_SPAN) // 4, value, self.call[stream.rank]))

    def wait_value32(self, addr, value, stream):
        assert addr // FLAG_SPAN == stream.rank, "stream waits are on this rank's own flags"
        stream.ops.append(("wait", stream.rank, (addr % FLAG_SPAN) // 4, value, self.call[stream.rank]))

    def memcpy_async(self, dst, src, nbytes, stream):
        stream.ops.append(("copy",))

    def run(self, seed: int) -> int:
        """Execute every stream in a random interleaving; returns the number of operations run."""
        rng = random.Random(seed)
        streams = [s for per_rank in self.streams for s in per_rank.values()]
        ran = 0
        while True:
            ready = [s for s in streams if s.done < len(s.ops) and self._ready(s, s.ops[s.done])]
            if not ready:
                stuck = {f"rank {s.rank} {s.name}": s.ops[s.done] for s in streams if s.done < len(s.ops)}
                assert not stuck, f"deadlock (seed {seed}): {stuck}"
                return ran
            s = rng.choice(ready)
            self._execute(s, s.ops[s.done])
            s.done += 1
            ran += 1

    def _ready(self, s, op) -> bool:
        if op[0] == "join":
            return op[1].done >= op[2]
        if op[0] == "wait":
            return self.mem[op[1]].get(op[2], (0, None))[0] >= op[3]
        return True

    def _execute(self, s, op) -> None:
        kind = op[0]
        if kind == "write":
            _, rank, word, value, call = op
            self.mem[rank][word] = (value, call if value else None)
        elif kind == "wait":
            _, rank, word, _, call = op
            if word == symm_layout.PEER_OK:
                return  # set at setup, lowered only by a peer that gave up: not a per-call flag
            raised_by = self.mem[rank][word][1]
            assert raised_by == call, (f"rank {rank} word {word} ({s.name} stream) released by call {raised_by}'s "
                                       f"raise while waiting in call {call}: a stale flag")
        elif kind == "zero":
            _, rank, lo, hi = op
            for word in range(lo, hi):
                self.mem[rank].pop(word, None)


@pytest.fixture
def symm_knobs():
    """``symm_knobs(NAME=value, ...)``: ``knobs.symm`` patched until the test ends."""
    with contextlib.ExitStack() as stack:
        yield lambda **values: stack.enter_context(knobs.symm.patch(**values))


def make_states(sim: Sim, monkeypatch):
    """Every rank's GroupState on the simulation (with knobs.symm.PUSH_STREAM_PER_PEER, the per-peer
    push streams are the simulation's "push to p" streams)."""
    from overlap_backend.runtime.streams import SYMM_PUSH_TO

    monkeypatch.setattr(group, "comm_stream", lambda index, slot: sim.streams[index][f"push to {slot - SYMM_PUSH_TO}"])
    monkeypatch.setattr(_cuda, "write_value32", sim.write_value32)
    monkeypatch.setattr(_cuda, "wait_value32", sim.wait_value32)
    monkeypatch.setattr(_cuda, "memcpy_async", sim.memcpy_async)
    states = []
    for r in range(sim.ws):
        st = group.GroupState.host_only(r, sim.ws)
        st.flags = SimpleNamespace(ptrs=[p * FLAG_SPAN for p in range(sim.ws)], local=r * FLAG_SPAN)
        st.data = SimpleNamespace(ptrs=[0] * sim.ws)
        st.push_stream, st.copy_stream = sim.streams[r]["push"], sim.streams[r]["copy"]
        st.device = SimpleNamespace(index=r)
        lo, hi = symm_layout.GRAPH_RESET

        def zero(compute, r=r, lo=lo, hi=hi):
            compute.ops.append(("zero", r, symm_layout.GRAPH_BLOCK + lo, symm_layout.GRAPH_BLOCK + hi))

        st._zero_graph_flags = zero
        st._count_replay = lambda word, compute: None  # the watchdog's replay counter: not a flag
        states.append(st)
    return states


def kernel_raise(sim, r, word):  # a kernel (compute stream) raises one of its rank's own flags
    sim.streams[r]["compute"].ops.append(("write", r, word, 1, sim.call[r]))


def kernel_wait(sim, r, word, stream="compute"):
    sim.streams[r][stream].ops.append(("wait", r, word, 1, sim.call[r]))


def queue_mm_rs(sim, states, r):
    """mm_rs's schedule (runtime/symm/mm_rs.py) with the kernel's flag traffic: remote chunks
    first (done flag per chunk), the push stream ships each once done, the own chunk's tiles wait
    for every peer's partial."""
    st, base, ws = states[r], symm_layout.GRAPH_BLOCK, sim.ws
    compute = sim.streams[r]["compute"]
    value = st.begin(compute, "mm_rs", graph=True)
    assert value == 1 and st.base == base
    for pos in range(ws - 1):
        kernel_raise(sim, r, base + symm_layout.DONE + (r + 1 + pos) % ws)
    for p in range(ws):
        if p != r:
            kernel_wait(sim, r, base + symm_layout.RS_ARRIVED + p)
    for pos in range(ws - 1):
        c = (r + 1 + pos) % ws
        _cuda.wait_value32(st.flag_addr(base + symm_layout.DONE + c), value, st.push_stream_to(c))
        st.push(c, 0, 0, 64, symm_layout.RS_ARRIVED + r, st.push_stream_to(c))
    st.end(compute)
    assert st.base == 0


def queue_ag_mm(sim, states, r):
    """ag_mm's schedule: shard pushed to every peer; the kernel and the gathered copy both wait for
    each peer's chunk."""
    st, base, ws = states[r], symm_layout.GRAPH_BLOCK, sim.ws
    compute = sim.streams[r]["compute"]
    st.begin(compute, "ag_mm", graph=True)
    for j in range(ws - 1):
        st.push((r - 1 - j) % ws, 0, 0, 64, symm_layout.AG_ARRIVED + r, st.push_stream_to((r - 1 - j) % ws))
    for p in range(ws):
        if p != r:
            kernel_wait(sim, r, base + symm_layout.AG_ARRIVED + p)
            kernel_wait(sim, r, base + symm_layout.AG_ARRIVED + p, stream="copy")
    st.end(compute)


def queue_mm_rs_cublas(sim, states, r, outer=2, run=3):
    """mm_rs's cuBLAS path, the real schedule (``symm_mm_rs.mm_rs_cublas``): its GEMMs run on
    CPU tensors at once (their data is not checked here), its flag traffic is recorded."""
    from overlap_backend.runtime.symm import mm_rs as symm_mm_rs

    ws, K, N = sim.ws, 4, 8
    sim.current_rank = r
    recv = torch.zeros(ws * outer * run, N)
    symm_mm_rs.mm_rs_cublas(states[r], torch.randn(outer * ws * run, K), torch.randn(K, N), None, recv, outer,
                            run, False, graph=True)
    assert states[r].base == 0


def queue_mm_ar_cublas(sim, states, r, M=10):
    """mm_ar's cuBLAS path, the real schedule (``symm_mm_ar.mm_ar_cublas``) over two rounds:
    reduce-scatter pushes, then the reduced chunks pushed to every peer and copied out."""
    from overlap_backend.runtime.symm import mm_ar as symm_mm_ar

    K, N = 4, 8
    sim.current_rank = r
    st = states[r]
    st.ensure_data = lambda nbytes, op="": None
    st.data_view = lambda dtype, shape, offset=0: torch.zeros(shape, dtype=dtype)
    symm_mm_ar.mm_ar_cublas(st, torch.randn(M, K), torch.randn(K, N), None, False, graph=True)
    assert st.base == 0


def queue_mm_ar_oneshot_torch(sim, states, r, M=6):
    """mm_ar one-shot summed by torch, the real schedule (``symm_mm_ar._mm_ar_oneshot_torch``): the partial
    pushed whole to every peer, the compute stream waiting for every peer's arrival flag."""
    from overlap_backend.runtime.symm import mm_ar as symm_mm_ar

    K, N = 4, 8
    sim.current_rank = r
    st = states[r]
    st.ensure_data = lambda nbytes, op="": None
    st.data_view = lambda dtype, shape, offset=0: torch.zeros(shape, dtype=dtype)
    compute = sim.streams[r]["compute"]
    first = len(compute.ops)
    symm_mm_ar._mm_ar_oneshot_torch(st, torch.randn(M, K), torch.randn(K, N), None, False, graph=True)
    assert st.base == 0
    waited = {op[2] for op in compute.ops[first:] if op[0] == "wait"}  # the sum reads every peer's slot
    assert all(symm_layout.GRAPH_BLOCK + symm_layout.RS_ARRIVED + p in waited for p in range(sim.ws) if p != r)


def compute_stream_of_current_rank(sim, monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: sim.streams[sim.current_rank]["compute"])


@pytest.mark.parametrize("ws,per_peer", [(2, False), (4, False), (4, True)], ids=["ws2", "ws4", "ws4-per-peer"])
@pytest.mark.parametrize("rs", ["kernel", "cublas", "mm_ar_cublas", "mm_ar_oneshot_torch"])
def test_captured_calls_toggle_flags_without_stale_releases_or_deadlocks(ws, per_peer, rs, monkeypatch, symm_knobs):
    """``per_peer``: the pushes to each peer on a stream of their own (knobs.symm.PUSH_STREAM_PER_PEER)."""
    from overlap_backend.runtime.symm import mm_ar as symm_mm_ar

    sim = Sim(ws)
    symm_knobs(PUSH_STREAM_PER_PEER=per_peer)
    states = make_states(sim, monkeypatch)
    compute_stream_of_current_rank(sim, monkeypatch)
    monkeypatch.setattr(symm_mm_ar, "ar_cublas_rounds", lambda *a: 2)
    queue_rs = {"kernel": queue_mm_rs, "cublas": queue_mm_rs_cublas, "mm_ar_cublas": queue_mm_ar_cublas,
                "mm_ar_oneshot_torch": queue_mm_ar_oneshot_torch}[rs]
    symm_knobs(BAND_ROWS_MIN=2)  # the cuBLAS path's 2 runs of 3 rows: a band each
    for call in range(4):  # replays queued back to back, the two ops alternating
        for r in range(ws):
            sim.call[r] = call
            (queue_rs if call % 2 == 0 else queue_ag_mm)(sim, states, r)
    ops = sum(len(s.ops) for per_rank in sim.streams for s in per_rank.values())
    for seed in range(60):
        for per_rank in sim.streams:
            for s in per_rank.values():
                s.done = 0
        sim.reset_memory()
        assert sim.run(seed) == ops
        # after the last replay every per-call word of the block is 0 again (READY included)
        for r in range(ws):
            left = {w: v for w, v in sim.mem[r].items() if v[0] and symm_layout.GRAPH_BLOCK <= w < symm_layout.PEER_OK}
            assert not left, (seed, r, left)
    assert all(st.graph_pinned for st in states)
    if per_peer:  # the pushes did spread over the peers' streams
        for r in range(ws):
            assert all(sim.streams[r][f"push to {p}"].ops for p in range(ws) if p != r), r


def test_the_check_catches_a_missing_reset(monkeypatch):
    """The simulation can fail: without the READY reset, a replay's push is released by the
    previous replay's READY (or an order deadlocks)."""
    sim = Sim(2)
    states = make_states(sim, monkeypatch)
    real_write = sim.write_value32

    def write_no_reset(addr, value, stream):
        if value == 0:
            return  # the resets of READY go missing
        real_write(addr, value, stream)

    monkeypatch.setattr(_cuda, "write_value32", write_no_reset)
    for call in range(3):
        for r in range(2):
            sim.call[r] = call
            queue_mm_rs(sim, states, r)
    failures = 0
    for seed in range(40):
        for per_rank in sim.streams:
            for s in per_rank.values():
                s.done = 0
        sim.reset_memory()
        try:
            sim.run(seed)
        except AssertionError:
            failures += 1
    assert failures > 0


def test_graph_block_is_a_copy_of_the_per_call_words():
    assert symm_layout.GRAPH_BLOCK >= symm_layout.CTA_BLOCKS + 2 * symm_layout.CTA_BLOCK_WORDS  # after every other block
    # then the words a watchdog's release must not raise to RELEASED (see GroupState._release_flags),
    # which end the buffer
    assert symm_layout.GRAPH_BLOCK + symm_layout.GRAPH_WORDS == symm_layout.PEER_OK < symm_layout.GAVE_UP
    assert symm_layout.GAVE_UP + symm_layout.WS_MAX == symm_layout.FLAG_WORDS
    lo, hi = symm_layout.GRAPH_RESET
    assert symm_layout.READY < lo and lo == symm_layout.AG_ARRIVED  # READY is reset by its consumer
    # arrivals and done flags of ag_mm / mm_rs / mm_ar, then of moe_experts
    assert lo < symm_layout.RS_ARRIVED < symm_layout.GATHERED < symm_layout.DONE < symm_layout.COUNTERS <= hi
    assert symm_layout.MOE_ARRIVED < symm_layout.MOE_RETURNED < symm_layout.MOE_DONE < hi == symm_layout.MOE_COUNTERS
    # in between, and after: words the kernels leave at 0 between calls (counters, the ticket, the
    # CTA counters of moe's comm kernel) or that a captured call never uses (CLAIM: the eager block's)
    assert symm_layout.COUNTERS < symm_layout.CLAIM < symm_layout.TICKET < symm_layout.MOE_ARRIVED
    assert hi < symm_layout.MOE_PUSHED < symm_layout.GRAPH_WORDS == symm_layout.MOE_PUSHED + symm_layout.WS_MAX


def test_status_words_and_report_codes_are_one_layout():
    """The status buffer (spec/symm_layout.py): a kernel's report in words 0 .. REPORT_WORDS - 1 (7
    written), then the watchdog's words, then the copy of GAVE_UP; the kernels' constexpr codes are
    the spec's values."""
    from overlap_backend.codegen import flags as kernel_flags

    assert 7 <= symm_layout.REPORT_WORDS <= symm_layout.STARTED
    assert symm_layout.STARTED < symm_layout.FINISHED < symm_layout.GRAPH_STARTED < symm_layout.GRAPH_FINISHED
    assert symm_layout.GRAPH_FINISHED < symm_layout.STATUS_GAVE_UP
    assert symm_layout.STATUS_GAVE_UP + symm_layout.WS_MAX == symm_layout.STATUS_WORDS
    for name in ("OP_AG_MM", "OP_MM_RS", "OP_MM_AR", "OP_AR_ONESHOT", "OP_MOE", "OP_CTA_STAGE1", "OP_CTA_COLLECT",
                 "OP_CTA_STAGE0", "OP_CTA_TAIL", "MOE_DONE_FLAG_BASE", "MOE_RETURN_FLAG_BASE", "READY_FLAG_BASE",
                 "GATHER_FLAG_BASE", "MOE_CAP_FLAG_BASE", "STATUS_TIMEOUT", "STATUS_MISMATCH"):
        assert getattr(kernel_flags, name).value == getattr(symm_layout, name), name
    assert kernel_flags.RELEASED_VALUE.value == symm_layout.RELEASED
    assert set(symm_layout.OP_NAMES) == {getattr(symm_layout, n) for n in dir(symm_layout) if n.startswith("OP_")
                                         and n != "OP_NAMES"}


def test_a_peer_that_gave_up_stalls_the_rank_at_the_end_of_its_call(monkeypatch):
    """Rank 0 gave up a call (its watchdog lowered PEER_OK in rank 1's flags): rank 1's next call
    runs, but its compute stream stops at the end instead of going on with what rank 0 sent."""
    sim = Sim(2)
    states = make_states(sim, monkeypatch)
    for r in range(2):
        queue_ag_mm(sim, states, r)
    sim.reset_memory()
    sim.mem[1][symm_layout.PEER_OK] = (0, None)
    with pytest.raises(AssertionError, match="deadlock") as e:
        sim.run(0)
    assert f"'rank 1 compute': ('wait', 1, {symm_layout.PEER_OK}, 1" in str(e.value), str(e.value)
    assert "'rank 0 compute'" not in str(e.value), "rank 0 should have finished its call"


def test_a_watchdog_release_tells_the_peers_first_and_keeps_who_gave_up(monkeypatch):
    """GroupState._overdue on rank 1 of 3: on the first report, every peer's GAVE_UP[1] = 1 and
    PEER_OK = 0, and its own GAVE_UP words copied to the status words, all before its own flags
    are raised to RELEASED (below GAVE_UP only, and not the tile tickets); later reports release again
    without telling."""
    ops = []
    word = lambda p, w: p * FLAG_SPAN + 4 * w  # noqa: E731
    release = [("set", word(1, lo), symm_layout.RELEASED, hi - lo) for lo, hi in symm_layout.RELEASE_SPANS]
    # the stuck call (epoch 5) waited for READY from rank 0 (raised), band 1 of rank 2's shard (still
    # at the last call's 4) and PEER_OK (1): the report names the one short flag, read before the release
    ag_word = symm_layout.AG_ARRIVED + 2 * 2 + 1
    flag_values = {word(1, symm_layout.READY): 5, word(1, ag_word): 4, word(1, symm_layout.PEER_OK): 1}
    snapshot = (ctypes.c_int32 * group.AWAITED_MAX)()
    snap0 = ctypes.addressof(snapshot)

    def copy_async(dst, src, n, stream):
        if snap0 <= dst < snap0 + ctypes.sizeof(snapshot):
            snapshot[(dst - snap0) // 4] = flag_values[src]
        ops.append(("copy", dst, src, n))

    monkeypatch.setattr(_cuda, "make_primary_context_current", lambda index: None)
    monkeypatch.setattr(_cuda, "memset32_async", lambda ptr, v, n, stream: ops.append(("set", ptr, v, n)))
    monkeypatch.setattr(_cuda, "copy_async", copy_async)
    monkeypatch.setattr(_cuda, "stream_synchronize", lambda stream: ops.append(("sync",)))
    monkeypatch.setattr(group.log, "error", lambda *a: None)
    st = group.GroupState.host_only(1, 3)
    st.flags = SimpleNamespace(ptrs=[p * FLAG_SPAN for p in range(3)], local=FLAG_SPAN)
    st.device, st._release_stream, st.status_ptr = SimpleNamespace(index=0), None, 7 << 40
    st.status[symm_layout.STARTED], st.status[symm_layout.FINISHED] = 5, 4
    st._awaited[5] = [(symm_layout.READY, 5, 1), (ag_word, 5, 2), (symm_layout.PEER_OK, 1, 1)]
    st._snapshot_ptr, st._snapshot = snap0, snapshot
    st._overdue("ag_mm", 2.0)
    assert ops == [("copy", snap0, word(1, symm_layout.READY), 4), ("copy", snap0 + 4, word(1, ag_word), 4),
                   ("copy", snap0 + 8, word(1, symm_layout.PEER_OK), 4), ("sync",),
                   ("set", word(0, symm_layout.GAVE_UP + 1), 1, 1), ("set", word(0, symm_layout.PEER_OK), 0, 1),
                   ("set", word(2, symm_layout.GAVE_UP + 1), 1, 1), ("set", word(2, symm_layout.PEER_OK), 0, 1),
                   ("copy", st.status_ptr + 4 * symm_layout.STATUS_GAVE_UP, word(1, symm_layout.GAVE_UP), 4 * symm_layout.WS_MAX),
                   *release]
    released = {w for _, addr, _, n in release for w in range((addr - FLAG_SPAN) // 4, (addr - FLAG_SPAN) // 4 + n)}
    assert released == set(range(symm_layout.GAVE_UP)) - {symm_layout.TICKET, symm_layout.GRAPH_BLOCK + symm_layout.TICKET}
    assert "ag_mm on rank 1" in st.stalled
    assert f"flag {ag_word} (band 1 of rank 2's shard to arrive): read 4, expected >= 5" in st.stalled, st.stalled
    assert "READY" not in st.stalled and "PEER_OK" not in st.stalled, st.stalled

    # a failed read of the flags still releases them (the release is what unblocks the streams)
    def refuse(stream):
        raise _cuda.CudaError("cuStreamSynchronize failed: CUDA_ERROR_UNKNOWN")

    monkeypatch.setattr(_cuda, "stream_synchronize", refuse)
    st.stalled = None
    ops.clear()
    st._overdue("ag_mm", 2.0)
    assert "could not be read" in st.stalled and ops[-3:] == release, ops
    ops.clear()
    st._overdue("ag_mm", 2.05)
    assert ops == release
    st.status = [0] * symm_layout.STATUS_WORDS
    st.status[symm_layout.STATUS_GAVE_UP + 2] = 1
    with pytest.raises(symm.SymmTimeoutError, match=r"Rank\(s\) \[2\] had given up"):
        st.check_status()


def test_stream_waits_are_named_and_compared_as_the_gpu_does():
    """describe_flag names the words the ops' stream waits use; flag_before compares int32 words the way
    cuStreamWaitValue32's GEQ does (a wrapped difference), so RELEASED satisfies every epoch."""
    ws, nb = 4, 2
    assert symm.describe_flag(symm_layout.READY + 3, 1, ws) == "rank 3 to start this call (its READY flag)"
    assert symm.describe_flag(symm_layout.AG_ARRIVED + 2 * nb + 1, nb, ws) == "band 1 of rank 2's shard to arrive"
    assert symm.describe_flag(symm_layout.RS_ARRIVED + (1 * ws + 3) * nb, nb, ws) == "band 0 of rank 3's partial (round 1) to arrive"
    assert symm.describe_flag(symm_layout.GATHERED + 2, 1, ws) == "band 0 of rank 2's reduced rows (round 0) to arrive"
    assert symm.describe_flag(symm_layout.DONE + 5, 1, ws) == "this rank's own tiles of band 0 of chunk 1 (round 1) to finish"
    assert symm.describe_flag(symm_layout.MOE_RETURNED + 1, 1, ws) == "rank 1's expert results for this rank's tokens to come back"
    assert symm.describe_flag(symm_layout.MOE_DONE + 2, 1, ws) == "this rank's own expert tiles for source position 2 to finish"
    assert symm.describe_flag(symm_layout.PEER_OK, 1, ws).endswith("(PEER_OK)")
    assert diagnostics.flag_before(4, 5) and not diagnostics.flag_before(5, 5) and not diagnostics.flag_before(6, 5)
    assert not diagnostics.flag_before(symm_layout.RELEASED, 2**31 - 2) and diagnostics.flag_before(5, symm_layout.RELEASED)


def test_stream_waits_are_recorded_once_per_flag_and_only_eagerly(monkeypatch):
    """stream_wait keeps each (word, value) of an eager call once (two streams waiting for one shard
    made the watchdog name it twice on 2×H200), up to AWAITED_MAX, and nothing of a captured call."""
    waited = []
    monkeypatch.setattr(_cuda, "wait_value32", lambda addr, value, stream: waited.append((addr, value)))
    st = group.GroupState.host_only(0, 2)
    st.flags = SimpleNamespace(ptrs=[0, FLAG_SPAN], local=0)
    st.epoch = st.value = 7
    for stream in ("compute", "copy"):
        st.stream_wait(symm_layout.AG_ARRIVED + 1, 7, stream, nbands=1)
    st.stream_wait(symm_layout.READY + 1, 7, "push")
    assert len(waited) == 3  # every wait is issued ...
    assert st._awaited[7] == [(symm_layout.AG_ARRIVED + 1, 7, 1), (symm_layout.READY + 1, 7, 1)]  # ... and named once
    for w in range(group.AWAITED_MAX + 5):
        st.stream_wait(symm_layout.RS_ARRIVED + w, 7, "push")
    assert len(st._awaited[7]) == group.AWAITED_MAX
    st.base, before = symm_layout.GRAPH_BLOCK, list(st._awaited[7])
    st.stream_wait(symm_layout.GRAPH_BLOCK + symm_layout.DONE, 1, "compute")
    assert st._awaited[7] == before



def test_ranks_sharing_a_gpu_leave_sms_free_for_the_drivers_copies():
    """Ranks sharing one GPU: their copies run on SMs, so the ranks' kernels together hold all but
    ``knobs.symm.SHARED_DEVICE_FREE_SMS`` of them, each an equal share (the same number on every rank, since the
    verdict comes from every rank's (host, boot, device))."""
    apart = [("h", "boot", 0, None), ("h", "boot", 1, None)]
    together = [("h", "boot", 0, None), ("h", "boot", 0, None)]
    other_node = [("h", "boot", 0, None), ("h2", "boot2", 0, None)]
    three_and_one = [("h", "boot", 0, None)] * 3 + [("h", "boot", 1, None)]
    assert support.ranks_per_device(apart) == 1
    assert support.ranks_per_device(together) == 2
    assert support.ranks_per_device(other_node) == 1
    assert support.ranks_per_device(three_and_one) == 3
    free = knobs.symm.SHARED_DEVICE_FREE_SMS
    try:
        support.shared_device.update(together=2, apart=1, three=3)
        assert symm.kernel_sms("together", 132) == (132 - free) // 2
        assert 2 * symm.kernel_sms("together", 132) + free <= 132
        assert 3 * symm.kernel_sms("three", 132) + free <= 132
        assert symm.kernel_sms("apart", 132) == 132
        assert symm.kernel_sms("never seen", 132) == 132
    finally:
        for name in ("together", "apart", "three"):
            support.shared_device.pop(name, None)


def test_growth_agreement_names_mismatched_sizes_and_absent_ranks():
    """ensure_data's agreement (group.agree_through_store): every rank's size when all come; a bounded
    wait that names the ranks that never come (their call needed no growth) instead of hanging."""
    import threading
    import time

    import torch.distributed as dist

    store = dist.HashStore()
    got = {}

    def ask(rank, value, key="g/grow1"):
        try:
            got[rank] = group.agree_through_store(store, key, rank, 3, value, timeout_s=5 if rank != 1 else 1)
        except Exception as e:  # noqa: BLE001 - the test reads it
            got[rank] = e

    threads = [threading.Thread(target=ask, args=(r, 1 << 20 if r != 2 else 3 << 20)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == {r: [1 << 20, 1 << 20, 3 << 20] for r in range(3)}, got  # every rank sees the same list

    got.clear()
    start = time.monotonic()
    threads = [threading.Thread(target=ask, args=(r, 1 << 20, "g/grow2")) for r in (0, 2)]  # rank 1 never comes
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 4 < time.monotonic() - start < 30
    for r in (0, 2):
        assert isinstance(got[r], symm.SymmTimeoutError) and "rank(s) [1] did not come within 5 s" in str(got[r]), got

    # rank 1 comes after the others gave up: it finds their verdict and raises too, instead of going
    # on alone (into the growth's collective, where it would hang)
    ask(1, 1 << 20, "g/grow2")
    assert isinstance(got[1], symm.SymmTimeoutError) and "every rank came, but late" in str(got[1]), got[1]
    assert "rank 0 gave up" in str(got[1]) or "rank 2 gave up" in str(got[1]), got[1]
