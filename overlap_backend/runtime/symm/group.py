"""A symm group's state: its symmetric buffers (allocated here, mapped by every peer through legacy
IPC handles), flags, status words, streams and epoch, and how one op call uses them.

One op call, on every rank (``epoch`` = the group's call counter, identical on every rank):

1. ``begin``: write ``READY[rank] = epoch`` into every peer's flags (from the compute stream, so
   after this rank's previous use of its buffers): peers may now push into this rank's buffers.
2. Copy-engine pushes on a high-priority stream: wait ``READY[peer] >= epoch`` (``cuStreamWaitValue32``),
   ``cuMemcpyAsync`` into the peer's data buffer, ``cuStreamWriteValue32`` the peer's arrival flag.
3. The Triton kernel on the compute stream waits for arrival flags per chunk (bounded spin).
4. ``end``: the compute stream waits for the side streams.

Flags are only ever raised to the current epoch (compare ``>=``), so nothing is reset between calls
and the host never synchronises. A kernel that times out leaves a word in the status buffer which
the next op call (or :meth:`GroupState.check_status`) raises as :class:`SymmTimeoutError`. Stream
waits have no timeout of their own: ``runtime/watchdog.py`` releases them when a call is overdue
(``knobs.symm.WATCHDOG_FACTOR`` x the timeout), which the next call raises in the same way.
"""

from __future__ import annotations

import ctypes
import logging
import math
import threading
import uuid

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.distributed_c10d import _resolve_process_group

from ...config import OverlapConfig
from ...spec import knobs
from ...spec import symm_layout as layout
from .. import cuda as _cuda
from .. import watchdog
from ..streams import SYMM_COPY_OUT, SYMM_PUSH, SYMM_PUSH_TO, comm_stream
from .diagnostics import SymmMismatchError, SymmTimeoutError, SymmUnavailable, describe_flag, flag_before, status_error
from .support import kernel_sms

log = logging.getLogger("overlap_backend.symm")

AWAITED_MAX = 32  # stream waits per eager call that the watchdog's report can name (the first ones)


class _Mapped:
    """One symmetric allocation: this rank's pointer and every peer's, mapped here."""

    def __init__(self, group, nbytes: int):
        self.nbytes = nbytes
        self.group = group
        self.rank = group.rank()
        self.local = 0
        self.ptrs: list[int] = []
        try:
            self.local = _cuda.malloc(nbytes)
            _cuda.memset(self.local, 0, nbytes)
            handle, why = _cuda.ipc_handle(self.local), None
        except Exception as e:  # noqa: BLE001 - reported to every rank below
            handle, why = None, f"{type(e).__name__}: {e}"
        handles = _agree(group, handle, why, f"allocating {nbytes} bytes")
        opened, why = [], None
        try:
            for p, h in enumerate(handles):
                opened.append(self.local if p == self.rank else _cuda.ipc_open(h))
        except Exception as e:  # noqa: BLE001
            why = f"{type(e).__name__}: {e}"
        self.ptrs = opened
        try:
            _agree(group, None, why, "mapping the peers' buffers")
        except SymmUnavailable:
            self.release()
            raise

    def release(self) -> None:
        self.close_peers()
        self.free_local()

    def close_peers(self) -> None:
        for p, ptr in enumerate(self.ptrs):
            if p != self.rank and ptr:
                try:
                    _cuda.ipc_close(ptr)
                except _cuda.CudaError as e:
                    log.debug("overlap symm: closing a peer mapping: %s", e)
        self.ptrs = []

    def free_local(self) -> None:
        if self.local:
            _cuda.free(self.local)
            self.local = 0


def _agree(group, value, why: str | None, what: str):
    """all_gather ``(value, why)``; raise SymmUnavailable on every rank if any rank failed."""
    gathered = [None] * group.size()
    dist.all_gather_object(gathered, (value, why), group=group)
    failures = [f"rank {r}: {w}" for r, (_, w) in enumerate(gathered) if w is not None]
    if failures:
        raise SymmUnavailable(f"{what} failed: " + "; ".join(failures))
    return [v for v, _ in gathered]


def agree_through_store(store, key: str, rank: int, ws: int, value: int, timeout_s: float) -> list[int]:
    """Every rank's ``value`` under ``key`` (one use per key), waiting at most ``timeout_s`` for them.
    Unlike a collective, a rank that never comes does not hang the others: they raise
    ``SymmTimeoutError`` naming it. (``ensure_data``: only the ranks whose call needs a bigger buffer
    come, and they all do when the ranks agree on their shapes.)

    The outcome is one atomic verdict (``compare_set``): the first rank to decide, having seen every
    value or having timed out, decides for all. A rank that comes after another gave up raises too,
    instead of going on alone into the growth's collective."""
    from datetime import timedelta

    keys = [f"{key}/{r}" for r in range(ws)]
    store.set(keys[rank], str(value))
    try:
        store.wait(keys, timedelta(seconds=timeout_s))
        saw_all, why = True, ""
    except RuntimeError as e:  # DistStoreError (a RuntimeError) on timeout
        saw_all, why = False, str(e)
    verdict = store.compare_set(f"{key}/verdict", "", "go" if saw_all else f"rank {rank} gave up")
    verdict = verdict.decode() if isinstance(verdict, bytes) else str(verdict)
    if verdict != "go":
        missing = [r for r in range(ws) if not store.check([keys[r]])]
        who = f"rank(s) {missing} did not come" if missing else "every rank came, but late"
        raise SymmTimeoutError(f"{who} within {timeout_s:g} s ({verdict}{': ' + why if why else ''})")
    return [int(store.get(k)) for k in keys]


class GroupState:
    """Symmetric buffers, flags, status word, streams and epoch of one process group."""

    def __init__(self, group_name: str, device: torch.device):
        self.group_name = group_name
        self.group = _resolve_process_group(group_name)
        self.ws = self.group.size()
        self.rank = self.group.rank()
        self.device = device
        self.timeout_ns = int(OverlapConfig.env_value("timeout_s") * 1e9)
        self._init_call_state()
        self.num_sms = kernel_sms(group_name, torch.cuda.get_device_properties(device).multi_processor_count)
        self.push_stream = comm_stream(device.index, SYMM_PUSH)
        self.copy_stream = comm_stream(device.index, SYMM_COPY_OUT)
        # words 0-7: a kernel's timeout report (codegen/flags.py); STARTED / FINISHED: the epochs of
        # the last call the compute stream reached / completed, GRAPH_STARTED / GRAPH_FINISHED: how
        # many captured calls replays reached / completed (read by the watchdog)
        self.status_ptr = _cuda.host_alloc_mapped(4 * layout.STATUS_WORDS)
        self.status = (ctypes.c_int32 * layout.STATUS_WORDS).from_address(self.status_ptr)
        self.flags = _Mapped(self.group, 4 * layout.FLAG_WORDS)
        # where the ranks agree on growing the data buffer (ensure_data): a key space of this state
        # alone (a later state of the same group, on the same store, must not read this one's keys)
        token = _agree(self.group, uuid.uuid4().hex if self.rank == 0 else None, None, "set-up")[0]
        self._store_prefix = f"overlap_symm/{group_name}/{token}"
        _cuda.memset(self.flags.local + 4 * layout.PEER_OK, 1, 1)  # (the word was 0: its low byte makes it 1)
        torch.cuda.synchronize(device)  # before any stream waits for it (set-up is eager, never captured)
        self.data: _Mapped | None = None
        self._status_arg = (self.flag_arg(layout.CLAIM), _cuda.DevicePointer(self.status_ptr, torch.int32))
        lo, hi = layout.GRAPH_RESET  # made here, not during a capture (it queries the pointer's attributes)
        self._graph_reset = _cuda.as_tensor(self.flags.local + 4 * (layout.GRAPH_BLOCK + lo), 4 * (hi - lo),
                                            device).view(torch.int32)
        # where the watchdog reads the stuck call's awaited flags (``_unraised_waits``)
        self._snapshot_ptr = _cuda.host_alloc_mapped(4 * AWAITED_MAX)
        self._snapshot = (ctypes.c_int32 * AWAITED_MAX).from_address(self._snapshot_ptr)
        self._watch_progress = True
        # made here, on the thread that has torch's context current; the watchdog thread only uses it
        self._release_stream = _cuda.stream_create_nonblocking()
        self._bump_args = {w: _cuda.DevicePointer(self.status_ptr + 4 * w, torch.int32)
                           for w in (layout.GRAPH_STARTED, layout.GRAPH_FINISHED)}
        from ...codegen import flags as _flags, launcher

        self._count_replays = True
        try:
            with launcher.preloading():  # compiled and loaded here, never inside a capture (a module load
                for arg in self._bump_args.values():  # may synchronise); both: their alignments differ
                    _flags.launch_bump(arg)
        except Exception as e:  # noqa: BLE001 - the ops must not fail for the watchdog's sake
            self._stop_counting_replays(e)
        # Per-call stream joins and flag operations through ctypes (one event per join kind, batched
        # stream memory operations): each torch.cuda wrapper or cuda-python call costs 4-9 us on an H200 host.
        self.fast = _cuda.fast_path()
        if self.fast:
            self._join_events = [_cuda.event_create() for _ in range(3)]
        limit_s = self.timeout_ns / 1e9 * knobs.symm.WATCHDOG_FACTOR + knobs.symm.WATCHDOG_SLACK_S
        self._watched = watchdog.watch(limit_s, self._calls_in_flight, self._overdue, self._call_name)

    def _init_call_state(self) -> None:
        """The host-side bookkeeping of the calls (no CUDA resource): ``__init__``'s and ``host_only``'s."""
        self.epoch = 0
        self._growths = 0  # data buffer growths agreed so far (ensure_data's store keys)
        self.base = 0  # first word of the current call's flag block: 0, or GRAPH_BLOCK while capturing
        self.value = 0  # what the current call raises its flags to and waits for: the epoch, or 1 captured
        self.graph_pinned = False  # a call was captured: its data buffer must never be freed or moved
        self.stalled: str | None = None  # set by the watchdog: why this group is unusable
        # The op of the last call on the captured protocol that this host issued (a private graph's eager run
        # or replay, private_graphs.py): the watchdog's name for a stuck one, unless a user's graph was captured.
        self.host_graph_call = ""
        self.private_capture = False  # private_graphs.py is capturing a call of this group
        self._user_graphs = False
        self._names = [""] * 64  # the op of each of the last 64 eager calls, by epoch % 64
        # the local flag words each of those calls' streams wait for: (word, value, bands per chunk)
        self._awaited: list[list[tuple[int, int, int]]] = [[] for _ in range(64)]
        self._ready_waited: set[tuple[int, int]] = set()  # (peer, stream id) this call waited for READY on
        self._push_to: dict[int, torch.cuda.Stream] = {}  # this call's per-peer push streams (PUSH_STREAM_PER_PEER)
        self._views: dict[tuple, Tensor] = {}
        self._peer_tables: tuple | None = None
        self._flag_args: dict[int, _cuda.DevicePointer] = {}
        self._kept: list[_Mapped] = []  # data buffers that captured graphs may still use
        self._kept_tables: list[tuple] = []  # peer tables (device tensors) that captured graphs may still read
        self.fast = False  # ctypes joins and batched flag operations (set by __init__ where libcuda allows)
        self._copy_joined = True  # the copy stream waits for the current call's start (see copy_stream)
        self._memop_batches: dict[tuple, object] = {}  # (kind, watched) -> a reusable batch (``_batch``)

    @classmethod
    def host_only(cls, rank: int, ws: int, group_name: str = "g") -> GroupState:
        """A state with a real one's call bookkeeping and no CUDA resource, group or watchdog: for the
        CPU tests and probes that run the real ``begin`` / ``push`` / ``end`` against mocked driver
        calls. They set what they model (flags, data, streams, device); ``status`` is a plain list."""
        st = cls.__new__(cls)
        st.group_name, st.rank, st.ws = group_name, rank, ws
        st.timeout_ns = 10**9
        st.status = [0] * layout.STATUS_WORDS
        st._init_call_state()
        return st

    # ------------------------------------------------------------------ pointers for the kernels
    def status_arg(self) -> tuple[_cuda.DevicePointer, _cuda.DevicePointer]:
        """(claim word, report) for the kernels' bounded waits (see codegen/flags.py)."""
        return self._status_arg

    def flag_arg(self, index: int) -> _cuda.DevicePointer:
        arg = self._flag_args.get(index)
        if arg is None:
            arg = self._flag_args[index] = _cuda.DevicePointer(self.flags.local + 4 * index, torch.int32)
        return arg

    def flag_addr(self, index: int, rank: int | None = None) -> int:
        return self.flags.ptrs[self.rank if rank is None else rank] + 4 * index

    def data_view(self, dtype: torch.dtype, shape, offset_bytes: int = 0) -> Tensor:
        """A tensor over this rank's data buffer (valid until the buffer grows)."""
        key = (dtype, tuple(shape), offset_bytes)
        view = self._views.get(key)
        if view is not None:
            return view
        if len(self._views) >= knobs.symm.MAX_VIEWS:
            # Shapes change with every length under dynamic shapes: keep the cache bounded (the views
            # hold no memory of their own, only Python objects over the one data buffer).
            self._views.clear()
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if self.data is None or offset_bytes + nbytes > self.data.nbytes:
            raise RuntimeError("overlap symm: data buffer too small (ensure_data first)")
        whole = _cuda.as_tensor(self.data.local + offset_bytes, nbytes, self.device)
        view = self._views[key] = whole.view(dtype).view(shape)
        return view

    def data_addr(self, rank: int, offset_bytes: int) -> int:
        return self.data.ptrs[rank] + offset_bytes

    def peer_tables(self) -> tuple[Tensor, Tensor]:
        """(every rank's data buffer address, every rank's flag buffer address) as int64 device
        tensors, for kernels that store into peers' memory."""
        # Rebuilt after every (re)allocation of the data buffer (ensure_data drops it): a new local
        # buffer can come back at the old address while the peers' buffers moved.
        if self._peer_tables is None:
            to_dev = lambda ptrs: torch.tensor(ptrs, dtype=torch.int64, device=self.device)  # noqa: E731
            self._peer_tables = persistent(lambda: (to_dev(self.data.ptrs), to_dev(self.flags.ptrs)), self.device)
        return self._peer_tables

    # -------------------------------------------------------------------------- buffer lifetime
    def ensure_data(self, nbytes: int, op: str = "a symm op") -> None:
        """Grow the data buffer to at least ``nbytes`` for a call of ``op`` (collective: every rank asks
        for the same size, since sizes follow from shapes; ``_agree_to_grow`` checks that first)."""
        if self.data is not None and self.data.nbytes >= nbytes:
            return
        self._agree_to_grow(nbytes, op)
        size = max(nbytes, 2 * self.data.nbytes if self.data is not None else 0, 1 << 20)
        size = -(-size // (2 << 20)) * (2 << 20)
        if self.data is not None:
            # Every push into the old buffer was awaited by its owner's kernels before this call.
            torch.cuda.synchronize(self.device)
            old, self.data = self.data, None
            self._views.clear()
            old_tables, self._peer_tables = self._peer_tables, None
            if self.graph_pinned:  # captured graphs hold its addresses (and the peers' mappings of it)
                self._kept.append(old)
                if old_tables is not None:  # ... and the peer tables' tensors
                    self._kept_tables.append(old_tables)
                _agree(self.group, None, None, "growing the data buffer")
            else:
                old.close_peers()
                _agree(self.group, None, None, "growing the data buffer")  # every peer closed its mapping
                old.free_local()
        self.data = _Mapped(self.group, size)
        log.info("overlap symm: group %s rank %d data buffer %d MiB", self.group_name, self.rank, size >> 20)

    def _agree_to_grow(self, nbytes: int, op: str) -> None:
        """Before growing (collectively): every rank asks for the same ``nbytes``, through the store,
        bounded by the timeout. Ranks that called with shapes needing different sizes raise
        ``SymmMismatchError`` here, all of them, before anything runs (the group stays usable). A rank
        whose call needs no growth does not come: the ranks that wait for it raise
        ``SymmTimeoutError`` and give the group up (telling the peers, whose call waits for theirs),
        instead of hanging in the growth's collective."""
        self.check_status()
        self._growths += 1
        what = f"overlap symm: {op}"
        try:
            store = dist.distributed_c10d._get_process_group_store(self.group)
        except Exception:  # noqa: BLE001 - (older torch) the default store; keys name the group
            store = dist.distributed_c10d._get_default_store()
        try:
            asked = agree_through_store(store, f"{self._store_prefix}/grow{self._growths}", self.rank, self.ws,
                                        nbytes, self.timeout_ns / 1e9)
        except SymmTimeoutError as e:
            self.stalled = (
                f"{what} on rank {self.rank} of group {self.group_name!r} needs a bigger data buffer ({nbytes} bytes), "
                f"and {e}, which every rank that needs one does: those ranks called the op with shapes that need "
                "less (they must be the same on every rank), or died. The group is unusable."
            )
            log.error("%s", self.stalled)
            try:
                _cuda.make_primary_context_current(self.device.index)
                self._release_flags(tell_peers=True)  # the peers' call waits for this rank's flags
            except Exception as release_error:  # noqa: BLE001 - the error below says what matters
                log.warning("overlap symm: telling the peers failed: %s", release_error)
            raise SymmTimeoutError(self.stalled) from None
        if len(set(asked)) > 1:
            raise SymmMismatchError(
                f"{what} on rank {self.rank} of group {self.group_name!r}: the ranks need data buffers of "
                f"{asked} bytes (by rank): they called the op with different shapes, which must be the same on "
                "every rank. Nothing ran; the group is still usable.")

    def release(self) -> None:
        watchdog.unwatch(self._watched)
        if self.data is not None:
            self.data.release()
            self.data = None
        for kept in self._kept:
            kept.release()
        self._kept.clear()
        self._kept_tables.clear()
        self.flags.release()
        if self.status_ptr:
            _cuda.host_free(self.status_ptr)
            self.status_ptr = 0
        if self._snapshot_ptr:
            _cuda.host_free(self._snapshot_ptr)
            self._snapshot_ptr = 0

    def set_timeout(self, seconds: float) -> None:
        """Bound this group's waits by ``seconds`` from the next call on (the kernels' flag waits and
        the watchdog; ``OVERLAP_TIMEOUT_S`` set the first value). Calls already captured in a CUDA
        graph keep the value they were captured with. For a first call that compiles kernels on
        every rank (ranks skewed by seconds) under a long bound, then a short one."""
        if not seconds > 0:
            raise ValueError(f"overlap symm: timeout must be > 0 s, got {seconds!r}")
        self.timeout_ns = int(seconds * 1e9)
        self._watched.limit_s = seconds * knobs.symm.WATCHDOG_FACTOR + knobs.symm.WATCHDOG_SLACK_S

    # ---------------------------------------------------------------------------------- one call
    def check_status(self) -> None:
        if self.status[0] != 0:  # a kernel's own report names the flag: it comes first
            e = status_error(list(self.status), self.group_name, self.timeout_ns / 1e9)
            raise type(e)(str(e) + self._gave_up_note())
        if self.stalled is not None:
            raise SymmTimeoutError(self.stalled + self._gave_up_note())

    def _gave_up_note(self) -> str:
        """Which peers gave up a call first (their waits released: what they sent is garbage), as read
        by the watchdog when it fired."""
        peers = [p for p in range(self.ws) if p != self.rank and self.status[layout.STATUS_GAVE_UP + p]]
        if not peers:
            return ""
        return (f" Rank(s) {peers} had given up a call of this group first (their watchdog fired and released "
                "their waits), so what they sent this rank since is garbage.")

    def _overdue(self, what: str, waited_s: float) -> None:
        """Watchdog thread: the oldest unfinished call started ``waited_s`` ago. Mark the group
        unusable and raise every local flag to ``RELEASED`` so that the stream waits (and kernel
        waits) end; again on every poll until the call finishes (a late peer may write an older
        epoch over a released flag)."""
        first = self.stalled is None
        if first:
            self.stalled = (
                f"overlap symm: {what} on rank {self.rank} of group {self.group_name!r} did not finish within "
                f"{waited_s:.1f} s (OVERLAP_TIMEOUT_S={self.timeout_ns / 1e9:g} x {knobs.symm.WATCHDOG_FACTOR}): "
                "a stream waited for a peer's flag that never came (a peer died, diverged or is far behind)."
                f"{self._unraised_waits()} Its waits were released, so this call's output and every later "
                "one's is garbage; the group is unusable."
            )
            log.error("%s", self.stalled)
        self._release_flags(tell_peers=first)

    def _unraised_waits(self) -> str:
        """Watchdog thread, before the release: which of the stuck eager call's stream waits (see
        ``stream_wait``) were still short of their value, read from the flags now; "" when none is
        known (a captured call: its waits are in the graph)."""
        s = self.status
        if s[layout.STARTED] <= s[layout.FINISHED]:
            return ""
        waits = list(self._awaited[s[layout.STARTED] % 64])
        if not waits:
            return ""
        try:  # the message must never keep the release below from happening
            _cuda.make_primary_context_current(self.device.index)  # (the watchdog thread has none of its own)
            for k, (word, _, _) in enumerate(waits):
                _cuda.copy_async(self._snapshot_ptr + 4 * k, self.flags.local + 4 * word, 4, self._release_stream)
            _cuda.stream_synchronize(self._release_stream)
        except Exception as e:  # noqa: BLE001
            return f" (Its flags could not be read: {e}.)"
        short = [f"flag {word} ({describe_flag(word, nbands, self.ws)}): read {self._snapshot[k]}, expected >= {value}"
                 for k, (word, value, nbands) in enumerate(waits) if flag_before(self._snapshot[k], value)]
        return f" Still short when it fired: {'; '.join(short)}." if short else ""

    def _release_flags(self, tell_peers: bool) -> None:
        # On a stream of its own that does not wait for the legacy default stream, which a blocked
        # compute stream may be. The watchdog thread has no current context until this (driver calls
        # fail without one).
        _cuda.make_primary_context_current(self.device.index)
        stream = self._release_stream
        if tell_peers:  # before this rank's kernels run on (in stream order): see PEER_OK
            for p in range(self.ws):
                if p != self.rank:
                    _cuda.memset32_async(self.flag_addr(layout.GAVE_UP + self.rank, p), 1, 1, stream)
                    _cuda.memset32_async(self.flag_addr(layout.PEER_OK, p), 0, 1, stream)
            _cuda.copy_async(self.status_ptr + 4 * layout.STATUS_GAVE_UP, self.flag_addr(layout.GAVE_UP),
                             4 * layout.WS_MAX, stream)
        for lo, hi in layout.RELEASE_SPANS:
            _cuda.memset32_async(self.flags.local + 4 * lo, layout.RELEASED, hi - lo, stream)

    def _batch(self, kind: str, epoch: int):
        """The reusable batch of stream memory operations of ``begin`` / ``end`` of an eager call, its
        values set to ``epoch`` (``end``'s PEER_OK wait stays 1)."""
        key = (kind, self._watch_progress)
        batch = self._memop_batches.get(key)
        if batch is None:
            W, R = _cuda.MEMOP_WRITE_VALUE_32, _cuda.MEMOP_WAIT_VALUE_32
            if kind == "begin":
                ops = [(W, self.status_ptr + 4 * layout.STARTED)] if self._watch_progress else []
                ops += [(W, self.flag_addr(layout.READY + self.rank, p)) for p in range(self.ws) if p != self.rank]
            else:
                ops = [(R, self.flag_addr(layout.PEER_OK))]
                ops += [(W, self.status_ptr + 4 * layout.FINISHED)] if self._watch_progress else []
            batch = self._memop_batches[key] = _cuda.memops(ops)
        for op in batch:
            op.value = 1 if op.operation == _cuda.MEMOP_WAIT_VALUE_32 else epoch
        return batch

    @property
    def copy_stream(self) -> torch.cuda.Stream:
        """The side stream of a call's copies out of the receive buffers. On the ctypes path it joins the
        call (waits for ``begin``'s record of the compute stream) when the call first uses it, so a call
        that copies nothing pays for neither join."""
        if not self._copy_joined:
            self._copy_joined = True
            _cuda.wait_event(self._copy_stream.cuda_stream, self._join_events[0])
        return self._copy_stream

    @copy_stream.setter
    def copy_stream(self, stream) -> None:
        self._copy_stream = stream

    def word(self, index: int) -> int:
        """Flag word ``index`` of the current call's block (eager, or captured: ``GRAPH_BLOCK``)."""
        return self.base + index

    def begin(self, compute: torch.cuda.Stream, what: str = "a symm call", graph: bool = False) -> int:
        """Start a call (``what``: the op, for the watchdog's error); tell every peer this rank's
        buffers are free (after everything already queued on ``compute``). Returns the value the
        call's flags are raised to: a new epoch, or 1 for a call being captured (``graph``: the
        toggling block, see ``GRAPH_BLOCK``; its READY words are awaited and reset here)."""
        self.check_status()
        if graph:
            self.base, self.value = layout.GRAPH_BLOCK, 1
            self.graph_pinned = True
            if not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
                self.host_graph_call = what
            elif not self.private_capture:
                self._user_graphs = True
            self._count_replay(layout.GRAPH_STARTED, compute)
        else:
            self.epoch += 1
            if self.epoch >= 2**31 - 1:
                raise RuntimeError("overlap symm: epoch counter exhausted (2^31 calls on one group)")
            self.base, self.value = 0, self.epoch
            self._names[self.epoch % 64] = what
            self._awaited[self.epoch % 64].clear()
        if self.fast and not graph:
            # STARTED (for the watchdog) and every peer's READY in one driver call
            try:
                _cuda.run_memops(compute.cuda_stream, self._batch("begin", self.epoch))
            except _cuda.CudaError as e:  # (the STARTED write into pinned memory refused: run unwatched)
                if not self._watch_progress:
                    raise
                self._unwatch(e)
                _cuda.run_memops(compute.cuda_stream, self._batch("begin", self.epoch))
        else:
            if not graph:
                self._progress(layout.STARTED, compute)
            for p in range(self.ws):
                if p != self.rank:
                    _cuda.write_value32(self.flag_addr(self.word(layout.READY + self.rank), p), self.value, compute)
        if self.fast:  # the copy stream waits for the same record when the call first uses it
            _cuda.join(self.push_stream.cuda_stream, compute.cuda_stream, self._join_events[0])
            self._copy_joined = False
        else:
            self.push_stream.wait_stream(compute)
            self._copy_stream.wait_stream(compute)
        self._ready_waited.clear()
        peers = [p for p in range(self.ws) if p != self.rank]
        self._push_to = ({p: comm_stream(self.device.index, SYMM_PUSH_TO + p) for p in peers}
                         if knobs.symm.PUSH_STREAM_PER_PEER and len(peers) > 1 else {})
        if graph:
            # Consume every peer's READY now, whether or not this call pushes to it, and reset it on
            # the same stream: the peer raises it again only in its next call, which starts after
            # this call's data reached it (so after this reset).
            for p in peers:
                self.stream_wait(self.word(layout.READY + p), 1, self.push_stream)
                _cuda.write_value32(self.flag_addr(self.word(layout.READY + p)), 0, self.push_stream)
                for stream in (self.push_stream, *self._push_to.values()):
                    self._ready_waited.add((p, id(stream)))
        for stream in self._push_to.values():  # after compute's work and the READY handling above
            stream.wait_stream(self.push_stream)
        return self.value

    def stream_wait(self, word: int, value: int, stream: torch.cuda.Stream, nbands: int = 1) -> None:
        """Later work on ``stream`` waits until this rank's flag ``word`` reaches ``value``. An eager
        call keeps the wait (``nbands``: bands per chunk, to name the flag) so that the watchdog's
        report says which flag never came."""
        _cuda.wait_value32(self.flag_addr(word), value, stream)
        if self.base == 0:
            waits = self._awaited[self.epoch % 64]  # once per flag: several streams may wait for the same one
            if len(waits) < AWAITED_MAX and (word, value, nbands) not in waits:
                waits.append((word, value, nbands))

    def push_stream_to(self, peer: int) -> torch.cuda.Stream:
        """The stream this call's pushes to ``peer`` go on (and the stream waits that must precede
        them): the push stream, or the peer's own with ``knobs.symm.PUSH_STREAM_PER_PEER``."""
        return self._push_to.get(peer, self.push_stream)

    def wait_ready(self, peer: int, stream: torch.cuda.Stream) -> None:
        """Later work on ``stream`` waits until ``peer`` started this call (its ``READY``), i.e. stopped
        reading what this rank writes into its buffers; once per (peer, stream) and call."""
        if (peer, id(stream)) not in self._ready_waited:
            self.stream_wait(self.word(layout.READY + peer), self.value, stream)
            self._ready_waited.add((peer, id(stream)))

    def push(self, peer: int, dst_offset: int, src_ptr: int, nbytes: int, flag: int,
             stream: torch.cuda.Stream | None = None) -> None:
        """Copy ``nbytes`` at ``src_ptr`` into ``peer``'s data buffer at ``dst_offset`` with the copy
        engine, then raise ``peer``'s flag ``flag`` to the epoch, on ``stream`` (default: the push
        stream; ``push_stream_to(peer)`` for callers that spread their pushes over the peers)."""
        stream = stream or self.push_stream
        self.wait_ready(peer, stream)
        if nbytes:
            _cuda.memcpy_async(self.data_addr(peer, dst_offset), src_ptr, nbytes, stream)
        _cuda.write_value32(self.flag_addr(self.word(flag), peer), self.value, stream)

    def end(self, compute: torch.cuda.Stream) -> None:
        for stream in self._push_to.values():
            compute.wait_stream(stream)
        if self.fast:
            _cuda.join(compute.cuda_stream, self.push_stream.cuda_stream, self._join_events[1])
            if not self._copy_joined:
                self._copy_joined = True
            else:
                _cuda.join(compute.cuda_stream, self._copy_stream.cuda_stream, self._join_events[2])
        else:
            compute.wait_stream(self.push_stream)
            compute.wait_stream(self._copy_stream)
        if self.fast and self.base == 0:
            # PEER_OK's wait (see stall_if_a_peer_gave_up) and FINISHED in one driver call
            waits = self._awaited[self.epoch % 64]
            if len(waits) < AWAITED_MAX:
                waits.append((layout.PEER_OK, 1, 1))
            _cuda.run_memops(compute.cuda_stream, self._batch("end", self.epoch))
            return
        self.stall_if_a_peer_gave_up(compute)
        if self.base == layout.GRAPH_BLOCK:
            self._zero_graph_flags(compute)
            self._count_replay(layout.GRAPH_FINISHED, compute)
            self.base, self.value = 0, self.epoch
        else:
            self._progress(layout.FINISHED, compute)

    def captured_call(self, compute: torch.cuda.Stream, finished: bool) -> None:
        """A captured call that does not go through ``begin``/``end`` (cta_pipeline_mlp's, which counts
        its epochs on the device) tells the watchdog where each replay starts and ends."""
        self._count_replay(layout.GRAPH_FINISHED if finished else layout.GRAPH_STARTED, compute)

    def stall_if_a_peer_gave_up(self, compute: torch.cuda.Stream) -> None:
        """End of every call: a peer that gave up a call sent garbage under valid flags, so
        ``compute`` stops here (until the watchdog fires and raises) instead of going on with it."""
        self.stream_wait(layout.PEER_OK, 1, compute)

    def _calls_in_flight(self) -> tuple[int, int]:
        """(calls the GPU started, calls it finished): eager epochs plus captured replays (watchdog)."""
        s = self.status
        if not self._count_replays:  # (turned off mid-way: the counts may not pair up)
            return s[layout.STARTED], s[layout.FINISHED]
        return s[layout.STARTED] + s[layout.GRAPH_STARTED], s[layout.FINISHED] + s[layout.GRAPH_FINISHED]

    def _call_name(self, _started: int) -> str:
        s = self.status
        if s[layout.STARTED] > s[layout.FINISHED]:
            return self._names[s[layout.STARTED] % 64] or "a symm call"
        if getattr(self, "host_graph_call", "") and not getattr(self, "_user_graphs", False):
            return self.host_graph_call
        return "a captured symm call (CUDA-graph replay)"

    def _count_replay(self, word: int, compute: torch.cuda.Stream) -> None:
        """A kernel on ``compute`` adds 1 to status word ``word`` (GRAPH_STARTED / GRAPH_FINISHED):
        captured, it counts every replay, which the watchdog then bounds like an eager call."""
        if not (self._watch_progress and self._count_replays):
            return
        from ...codegen import flags as _flags

        try:
            with torch.cuda.stream(compute):
                _flags.launch_bump(self._bump_args[word])
        except Exception as e:  # noqa: BLE001 - (raised before the launch reached CUDA) the op goes on
            self._stop_counting_replays(e)

    def _stop_counting_replays(self, e: Exception) -> None:
        self._count_replays = False
        log.warning("overlap symm: group %s: CUDA-graph replays run without the watchdog (%s: %s)",
                    self.group_name, type(e).__name__, e)

    def _progress(self, word: int, compute: torch.cuda.Stream) -> None:
        """The compute stream writes the epoch into status word ``word`` (STARTED / FINISHED) for
        the watchdog. Should the driver refuse a stream write into pinned host memory, the group
        runs unwatched (warned once) rather than failing its ops."""
        if not self._watch_progress:
            return
        try:
            _cuda.write_value32(self.status_ptr + 4 * word, self.epoch, compute)
        except _cuda.CudaError as e:
            self._unwatch(e)

    def _unwatch(self, e: Exception) -> None:
        self._watch_progress = False
        watchdog.unwatch(self._watched)
        log.warning("overlap symm: group %s runs without the stream-wait watchdog: %s", self.group_name, e)

    def _zero_graph_flags(self, compute: torch.cuda.Stream) -> None:
        """A captured call consumed its arrival and done flags: back to 0 on ``compute``, after its
        streams joined and before its next READY (a kernel node in the graph)."""
        with torch.cuda.stream(compute):
            self._graph_reset.zero_()


def persistent(make, device: torch.device):
    """``make()`` run where its allocations outlive the call: outside any CUDA-graph memory pool.

    While torch.compile's ``mode="reduce-overhead"`` (cudagraph trees) warms a graph up, every
    allocation *of the calling thread* goes to the graph's pool
    (``torch._C._cuda_beginAllocateCurrentThreadToPool``), and recording then fails on pool tensors
    that are not graph outputs ("tensor(s) in the cudagraph pool not tracked as outputs"). State
    kept across calls (peer tables, re-laid-out weights, staging buffers) is therefore made on a
    helper thread, on the device's default stream, ordered after the caller's stream and before
    anything the caller queues next."""
    if device.type != "cuda":
        return make()
    caller = torch.cuda.current_stream(device)
    default = torch.cuda.default_stream(device)
    box: dict = {}

    def work():
        try:
            with torch.cuda.device(device):
                default.wait_stream(caller)
                box["value"] = make()
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            box["error"] = e

    t = threading.Thread(target=work, name="overlap-persistent-alloc")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    caller.wait_stream(default)
    return box["value"]
