"""The ``symm`` lowering: symmetric peer buffers, epoch flags, copy-engine pushes, Triton tile kernels.

For a process group whose ranks are CUDA processes on one node with peer access. Per group, every
rank allocates (``cudaMalloc``, an allocation of its own) one *data* buffer and one *flag* buffer and
maps every peer's through legacy IPC handles (exchanged with ``all_gather_object``); a pinned,
device-mapped *status* word reports kernel timeouts. No multicast object is ever created.

One op call, on every rank (``epoch`` = the group's call counter, identical on every rank):

1. ``begin``: write ``READY[rank] = epoch`` into every peer's flags (from the compute stream, so
   after this rank's previous use of its buffers): peers may now push into this rank's buffers.
2. Copy-engine pushes on a high-priority stream: wait ``READY[peer] >= epoch`` (``cuStreamWaitValue32``),
   ``cuMemcpyAsync`` into the peer's data buffer, ``cuStreamWriteValue32`` the peer's arrival flag.
3. The Triton kernel on the compute stream waits for arrival flags per chunk (bounded spin).
4. ``end``: the compute stream waits for the side streams.

Flags are only ever raised to the current epoch (compare ``>=``), so nothing is reset between calls
and the host never synchronises. A kernel that times out leaves a word in the status buffer which
the next op call (or :func:`check_status`) raises as :class:`SymmTimeoutError`. Stream waits have
no timeout of their own: ``runtime/watchdog.py`` releases them when a call is overdue
(``WATCHDOG_FACTOR`` x the timeout), which the next call raises in the same way.

Falls back to the ``p2p`` lowering, on every rank of the group at once, for what the kernels do not
cover (see ``_unsupported_*``) and when setting up the buffers fails (reason logged).
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import math
import socket
import threading
import uuid

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.distributed_c10d import _resolve_process_group

from . import cuda as _cuda
from . import watchdog
from .streams import SYMM_COPY_OUT, SYMM_PUSH, SYMM_PUSH_TO, comm_stream

log = logging.getLogger("overlap_backend.symm")

WS_MAX = 8  # ranks of one node
# Process-group backends whose groups symm serves. The data path never calls the group's
# collectives (set-up uses all_gather_object), so a gloo group of ranks sharing one GPU works too:
# tests add "gloo" to run the multi-rank kernels and flag protocol on a one-GPU machine
# (OVERLAP_TEST_SHARED_GPU, tests/dist_harness.py).
GROUP_BACKENDS: tuple[str, ...] = ("nccl",)
MAX_VIEWS = 64  # GroupState.data_view's cache of tensor views over the data buffer, per group
AR_ROWS_PER_CHUNK = 512  # mm_ar: at least this many rows per chunk and round (an efficient GEMM)...
AR_MAX_ROUNDS = 4  # ...and at most this many rounds (each costs ~3 host calls per peer and band)
ONESHOT_MAX_BYTES = 4 << 20  # mm_ar: one-shot (push the whole partial) up to this partial size
BAND_ROWS_MIN = 512  # chunks travel in bands of at least this many rows (a multiple of every BM)...
MAX_BANDS = 8  # ...and at most this many bands per chunk
_SLOTS = AR_MAX_ROUNDS * WS_MAX * MAX_BANDS

# The stream-wait watchdog (runtime/watchdog.py)
STARTED, FINISHED = 8, 9  # status words the compute stream writes for it (eager calls: their epochs)
GRAPH_STARTED, GRAPH_FINISHED = 10, 11  # captured calls: counted up by a kernel at each replay
WATCHDOG_FACTOR = 1.25  # a call not finished this many OVERLAP_TIMEOUT_S after it started is dead...
WATCHDOG_SLACK_S = 0.25  # ...plus this: later than the kernels' own bounded waits, which say more
RELEASED = 0x7FFFFFFF  # what an overdue call's flags are set to: >= every epoch (stream waits, kernels)
AWAITED_MAX = 32  # stream waits per eager call that the watchdog's report can name (the first ones)

# Flag buffer layout, in int32 words. "Arrived" flags are written by peers, the others locally.
READY = 0  # [p]: rank p's buffers are free for this call (p wrote its epoch here)
AG_ARRIVED = 16  # [p * nbands + b]: band b of rank p's shard is in this rank's ag_mm receive buffer
RS_ARRIVED = AG_ARRIVED + WS_MAX * MAX_BANDS  # [(round * ws + p) * nbands + b]: rank p's partial arrived
GATHERED = RS_ARRIVED + _SLOTS  # [(round * ws + p) * nbands + b]: rank p's reduced band arrived (mm_ar)
DONE = GATHERED + _SLOTS  # [(round * ws + c) * nbands + b]: this rank finished that band of chunk c (local)
COUNTERS = DONE + _SLOTS  # same index: tiles of that band finished so far (local)
CLAIM = COUNTERS + _SLOTS  # a kernel timed out (local; the report itself is in pinned host memory)
TICKET = CLAIM + 1  # mm_rs/mm_ar tile tickets (local; 0 between calls)
# moe_experts (runtime/moe_symm.py): s / d are ranks, pos = (source - rank - 1) % ws a source position.
MOE_ARRIVED = TICKET + 1  # [s]: source s's dispatch rows are in this rank's dispatch slot s (s's copy engine)
MOE_RETURNED = MOE_ARRIVED + WS_MAX  # [d]: rank d's results for this rank's rows are in combine slot d (d's SMs/CE)
MOE_DONE = MOE_RETURNED + WS_MAX  # [pos]: the producer finished every tile of that source (local)
MOE_COUNTERS = MOE_DONE + WS_MAX  # [pos]: its tiles finished so far (local; 0 between calls)
MOE_PUSHED = MOE_COUNTERS + WS_MAX  # [pos]: communication CTAs done copying that segment (local; 0 between calls)
# [s]: the row count of x on source s, i.e. the stride of its slots, written by s after this rank's READY and
# before its dispatch rows; gate_up_kernel compares it with this rank's own (moe_experts on symm needs the same
# on every rank). A value, not a flag: one word for eager and captured calls alike (outside the graph block).
MOE_CAP = MOE_PUSHED + WS_MAX
# cta_pipeline_mlp (codegen/cta.py): two blocks of words, one for eager calls (epochs from the host's
# counter) and one for calls inside captured CUDA graphs (epochs counted on the device), so that each
# block's flags only ever see one increasing sequence. Offsets inside a block:
CTA_CHUNK_WORDS = 4096
CTA_ROW_WORDS = 1024
CTA_ARRIVED = 0  # [(g * tp + p) * nch + j]: stage-0 rank p's block (g, j) is in this rank's buffer
CTA_COUNTERS = CTA_ARRIVED + CTA_CHUNK_WORDS  # [g * nch + j]: tiles of block (g, j) stored (stage 0, local)
CTA_DONE = CTA_COUNTERS + CTA_CHUNK_WORDS // 2  # [g * nch + j]: block (g, j) staged (stage 0, local)
CTA_Y_DONE = CTA_DONE + CTA_CHUNK_WORDS // 2  # [t * tiles_m + m]: stage-1 rank t's row block m is here
# [m]: tiles of row block m done (stage 1, local); stage 0: [t * tiles_m + m], its tail tiles for rank t
CTA_Y_COUNTERS = CTA_Y_DONE + CTA_ROW_WORDS
CTA_TAIL_ARRIVED = CTA_Y_COUNTERS + CTA_ROW_WORDS  # [p * tiles_m + m]: stage-0 rank p's tail of row block m is here
CTA_EPOCH = CTA_TAIL_ARRIVED + CTA_ROW_WORDS  # the epoch the kernels read (local)
CTA_READY = CTA_EPOCH + 1  # [p]: graph block: rank p started this call (peers write)
CTA_BLOCK_WORDS = CTA_READY + WS_MAX
CTA_BLOCKS = MOE_CAP + WS_MAX  # the eager block, then the graph block


def cta_block(graph: bool) -> int:
    """First word of the cta_pipeline_mlp block for eager calls or captured ones."""
    return CTA_BLOCKS + (CTA_BLOCK_WORDS if graph else 0)


# Calls captured into CUDA graphs (ag_mm, mm_rs, mm_ar, moe_experts): a copy of the words READY ..
# MOE_PUSHED at GRAPH_BLOCK. A stream memory operation's value is baked into the graph, so there flags *toggle*
# instead of counting epochs: every raise writes 1, every wait is for >= 1, and the consumer resets
# each flag to 0 once consumed, in stream order before it next tells the raiser to go on (READY:
# the push stream, right after waiting for it; arrival and done flags: the compute stream, after
# the call's streams joined). Each word then sees 0, 1, 0, 1, ... with one raiser and one resetter
# per call, and a replay needs no value from the host (``GroupState.begin(graph=True)``).
GRAPH_BLOCK = CTA_BLOCKS + 2 * CTA_BLOCK_WORDS
GRAPH_WORDS = MOE_PUSHED + WS_MAX
# The words a captured call's end resets: arrivals and done flags (AG_ARRIVED .. DONE, MOE_ARRIVED ..
# MOE_DONE), and between them COUNTERS, CLAIM and TICKET, which are 0 between calls anyway (one
# kernel for the whole range)
GRAPH_RESET = (AG_ARRIVED, MOE_COUNTERS)
# A rank whose watchdog fires releases its own waits, so its kernels and pushes run on and send its
# peers garbage under flags that look valid. Before that it lowers PEER_OK in every peer (1 from setup,
# 0 once a peer gave up) and marks itself in their GAVE_UP words; every call's end waits for PEER_OK
# >= 1 on the compute stream, so a peer that consumed such garbage stalls there instead of going on,
# and its own watchdog turns that into an exception (its release raises PEER_OK to RELEASED). GAVE_UP
# lies past the words a release raises: it says which peer gave up.
PEER_OK = GRAPH_BLOCK + GRAPH_WORDS
GAVE_UP = PEER_OK + 1  # [p]: rank p gave up a call (written by p)
FLAG_WORDS = GAVE_UP + WS_MAX
# What a release raises to RELEASED: every word below GAVE_UP but the tile tickets (eager and graph
# block), which are not flags but tile numbers: a kernel drawing from RELEASED gets a negative tile
# and addresses outside its operands (an illegal address after a release: twenty-first session).
RELEASE_SPANS = ((0, TICKET), (TICKET + 1, GRAPH_BLOCK + TICKET), (GRAPH_BLOCK + TICKET + 1, GAVE_UP))
STATUS_GAVE_UP = 16  # status words 16..23: a copy of GAVE_UP, made by the watchdog when it fires
STATUS_WORDS = STATUS_GAVE_UP + WS_MAX


def band_rows(rows: int) -> int:
    """Rows per band of a chunk of ``rows`` rows: depends only on ``rows``, so every rank agrees,
    and a multiple of BAND_ROWS_MIN (so of every block height); at most MAX_BANDS bands."""
    per = max(BAND_ROWS_MIN, -(-rows // MAX_BANDS))
    return -(-per // BAND_ROWS_MIN) * BAND_ROWS_MIN


def bands(rows: int) -> list[tuple[int, int]]:
    """(first row, row count) of each band of a chunk of ``rows`` rows (one empty band if rows == 0)."""
    step = band_rows(rows)
    return [(lo, min(step, rows - lo)) for lo in range(0, rows, step)] or [(0, 0)]


# Copy-engine pushes to different peers on different streams (True), so that the driver can run them
# on different copy engines at once, or all on one push stream in the order they are queued (False).
# A module setting, read at each call's ``begin``; it changes nothing at 2 ranks (one peer). With one
# stream, a rank's pushes to its ws - 1 peers go one after the other: at 4 GPUs the mm_rs op took
# 0.303 ms where its kernel alone takes 0.205 and NCCL's reduce-scatter 0.197 (fifteenth and
# seventeenth sessions). Not measured on 4 GPUs yet: off.
PUSH_STREAM_PER_PEER = False


class SymmUnavailable(RuntimeError):
    """Symmetric memory cannot be set up for a group (the op falls back to ``p2p``)."""


class SymmTimeoutError(RuntimeError):
    """A kernel gave up waiting for a peer's flag."""


class SymmMismatchError(SymmTimeoutError):
    """A kernel found that a peer called the op with sizes this rank's call does not match (the group
    is then unusable, as after a timeout)."""


# ------------------------------------------------------------------------------------ support
_support: dict[str, str | None] = {}
_support_lock = threading.Lock()
# Groups where two ranks share one GPU (set by ``_agree_support``). There a device-to-device copy
# between the ranks' buffers runs as a driver kernel on the SMs, not on a copy engine, so a
# persistent kernel that spins on data those copies deliver must leave SMs free for them: with all
# 132 SMs held by mm_ar's rounds kernel (8 warps, 144 KB of shared memory per CTA) the pushes never
# ran and both ranks hung (twenty-first session); 4 SMs left free fixed it.
_shared_device: dict[str, bool] = {}
SHARED_DEVICE_FREE_SMS = 4


def _local_problem() -> str | None:
    if not torch.cuda.is_available():
        return "CUDA is not available"
    if (why := _cuda.import_error()) is not None:
        return why
    try:
        import triton  # noqa: F401
    except ImportError as e:
        return f"Triton is not installed ({e})"
    if torch.cuda.get_device_capability() < (9, 0):
        return f"{torch.cuda.get_device_name()} is not Hopper or newer (TMA tile kernels)"
    return None


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def group_support(group_name: str) -> str | None:
    """None when ``symm`` can run on this group, else why not. The same answer on every rank: for
    NCCL groups it is agreed with collectives (once per group, cached), so call it at the same
    point on every rank (the passes do: compile time)."""
    with _support_lock:
        if group_name in _support:
            return _support[group_name]
    group = _resolve_process_group(group_name)
    backend = str(dist.get_backend(group)).lower()
    if not any(b in backend for b in GROUP_BACKENDS):
        why = f"group backend is {backend!r}, not NCCL"
    elif group.size() > WS_MAX:
        why = f"group of {group.size()} ranks > {WS_MAX} (one node)"
    else:
        why, shared = _agree_support(group)
        _shared_device[group_name] = shared
    with _support_lock:
        _support[group_name] = why
    return why


def kernel_sms(group_name: str, sms: int) -> int:
    """The SMs the group's persistent kernels may hold (their grids' bound): all ``sms`` of the
    GPU, less ``SHARED_DEVICE_FREE_SMS`` where ranks of the group share a GPU (the same on every rank)."""
    return sms - SHARED_DEVICE_FREE_SMS if _shared_device.get(group_name) else sms


def ranks_share_a_device(infos) -> bool:
    """Whether two of the ranks' ``(host, boot id, device, ...)`` name the same GPU."""
    places = [tuple(info[:3]) for info in infos]
    return len(set(places)) < len(places)


def _agree_support(group) -> tuple[str | None, bool]:
    """(why symm cannot run on ``group``, or None; whether ranks of it share a GPU)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():  # the passes may run under a fake mode; this needs real tensors
        local = _local_problem()
        device = torch.cuda.current_device() if local is None else -1
        infos = [None] * group.size()
        dist.all_gather_object(infos, (socket.gethostname(), _boot_id(), device, local), group=group)
        shared = ranks_share_a_device(infos)
        for rank, (_, _, _, why) in enumerate(infos):
            if why is not None:
                return f"rank {rank}: {why}", shared
        if len({(h, b) for h, b, _, _ in infos}) > 1:
            return "the group spans several nodes", shared
        no_peer = [
            info[2] for info in infos if info[2] != device and not _cuda.can_access_peer(device, info[2])
        ]
        verdicts = [None] * group.size()
        dist.all_gather_object(verdicts, no_peer, group=group)
        for rank, bad in enumerate(verdicts):
            if bad:
                return f"rank {rank} (cuda:{infos[rank][2]}) has no peer access to cuda:{bad}", shared
    return None, shared


# -------------------------------------------------------------------------------- group state
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
        from ..config import OverlapConfig

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
        self.status_ptr = _cuda.host_alloc_mapped(4 * STATUS_WORDS)
        self.status = (ctypes.c_int32 * STATUS_WORDS).from_address(self.status_ptr)
        self.flags = _Mapped(self.group, 4 * FLAG_WORDS)
        # where the ranks agree on growing the data buffer (ensure_data): a key space of this state
        # alone (a later state of the same group, on the same store, must not read this one's keys)
        token = _agree(self.group, uuid.uuid4().hex if self.rank == 0 else None, None, "set-up")[0]
        self._store_prefix = f"overlap_symm/{group_name}/{token}"
        _cuda.memset(self.flags.local + 4 * PEER_OK, 1, 1)  # (the word was 0: its low byte makes it 1)
        torch.cuda.synchronize(device)  # before any stream waits for it (set-up is eager, never captured)
        self.data: _Mapped | None = None
        self._status_arg = (self.flag_arg(CLAIM), _cuda.DevicePointer(self.status_ptr, torch.int32))
        lo, hi = GRAPH_RESET  # made here, not during a capture (it queries the pointer's attributes)
        self._graph_reset = _cuda.as_tensor(self.flags.local + 4 * (GRAPH_BLOCK + lo), 4 * (hi - lo),
                                            device).view(torch.int32)
        # where the watchdog reads the stuck call's awaited flags (``_unraised_waits``)
        self._snapshot_ptr = _cuda.host_alloc_mapped(4 * AWAITED_MAX)
        self._snapshot = (ctypes.c_int32 * AWAITED_MAX).from_address(self._snapshot_ptr)
        self._watch_progress = True
        # made here, on the thread that has torch's context current; the watchdog thread only uses it
        self._release_stream = _cuda.stream_create_nonblocking()
        self._bump_args = {w: _cuda.DevicePointer(self.status_ptr + 4 * w, torch.int32)
                           for w in (GRAPH_STARTED, GRAPH_FINISHED)}
        from ..codegen import flags as _flags, launcher

        self._count_replays = True
        try:
            with launcher.preloading():  # compiled and loaded here, never inside a capture (a module load
                for arg in self._bump_args.values():  # may synchronise); both: their alignments differ
                    _flags.launch_bump(arg)
        except Exception as e:  # noqa: BLE001 - the ops must not fail for the watchdog's sake
            self._stop_counting_replays(e)
        self._watched = watchdog.watch(self.timeout_ns / 1e9 * WATCHDOG_FACTOR + WATCHDOG_SLACK_S,
                                       self._calls_in_flight, self._overdue, self._call_name)

    def _init_call_state(self) -> None:
        """The host-side bookkeeping of the calls (no CUDA resource): ``__init__``'s and ``host_only``'s."""
        self.epoch = 0
        self._growths = 0  # data buffer growths agreed so far (ensure_data's store keys)
        self.base = 0  # first word of the current call's flag block: 0, or GRAPH_BLOCK while capturing
        self.value = 0  # what the current call raises its flags to and waits for: the epoch, or 1 captured
        self.graph_pinned = False  # a call was captured: its data buffer must never be freed or moved
        self.stalled: str | None = None  # set by the watchdog: why this group is unusable
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

    @classmethod
    def host_only(cls, rank: int, ws: int, group_name: str = "g") -> GroupState:
        """A state with a real one's call bookkeeping and no CUDA resource, group or watchdog: for the
        CPU tests and probes that run the real ``begin`` / ``push`` / ``end`` against mocked driver
        calls. They set what they model (flags, data, streams, device); ``status`` is a plain list."""
        st = cls.__new__(cls)
        st.group_name, st.rank, st.ws = group_name, rank, ws
        st.timeout_ns = 10**9
        st.status = [0] * STATUS_WORDS
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
        if len(self._views) >= MAX_VIEWS:
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
        self._watched.limit_s = seconds * WATCHDOG_FACTOR + WATCHDOG_SLACK_S

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
        peers = [p for p in range(self.ws) if p != self.rank and self.status[STATUS_GAVE_UP + p]]
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
                f"{waited_s:.1f} s (OVERLAP_TIMEOUT_S={self.timeout_ns / 1e9:g} x {WATCHDOG_FACTOR}): a stream "
                "waited for a peer's flag that never came (a peer died, diverged or is far behind)."
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
        if s[STARTED] <= s[FINISHED]:
            return ""
        waits = list(self._awaited[s[STARTED] % 64])
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
                 for k, (word, value, nbands) in enumerate(waits) if _before(self._snapshot[k], value)]
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
                    _cuda.memset32_async(self.flag_addr(GAVE_UP + self.rank, p), 1, 1, stream)
                    _cuda.memset32_async(self.flag_addr(PEER_OK, p), 0, 1, stream)
            _cuda.copy_async(self.status_ptr + 4 * STATUS_GAVE_UP, self.flag_addr(GAVE_UP), 4 * WS_MAX, stream)
        for lo, hi in RELEASE_SPANS:
            _cuda.memset32_async(self.flags.local + 4 * lo, RELEASED, hi - lo, stream)

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
            self.base, self.value = GRAPH_BLOCK, 1
            self.graph_pinned = True
            self._count_replay(GRAPH_STARTED, compute)
        else:
            self.epoch += 1
            if self.epoch >= 2**31 - 1:
                raise RuntimeError("overlap symm: epoch counter exhausted (2^31 calls on one group)")
            self.base, self.value = 0, self.epoch
            self._names[self.epoch % 64] = what
            self._awaited[self.epoch % 64].clear()
            self._progress(STARTED, compute)
        for p in range(self.ws):
            if p != self.rank:
                _cuda.write_value32(self.flag_addr(self.word(READY + self.rank), p), self.value, compute)
        self.push_stream.wait_stream(compute)
        self.copy_stream.wait_stream(compute)
        self._ready_waited.clear()
        peers = [p for p in range(self.ws) if p != self.rank]
        self._push_to = ({p: comm_stream(self.device.index, SYMM_PUSH_TO + p) for p in peers}
                         if PUSH_STREAM_PER_PEER and len(peers) > 1 else {})
        if graph:
            # Consume every peer's READY now, whether or not this call pushes to it, and reset it on
            # the same stream: the peer raises it again only in its next call, which starts after
            # this call's data reached it (so after this reset).
            for p in peers:
                self.stream_wait(self.word(READY + p), 1, self.push_stream)
                _cuda.write_value32(self.flag_addr(self.word(READY + p)), 0, self.push_stream)
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
        them): the push stream, or the peer's own with ``PUSH_STREAM_PER_PEER``."""
        return self._push_to.get(peer, self.push_stream)

    def wait_ready(self, peer: int, stream: torch.cuda.Stream) -> None:
        """Later work on ``stream`` waits until ``peer`` started this call (its ``READY``), i.e. stopped
        reading what this rank writes into its buffers; once per (peer, stream) and call."""
        if (peer, id(stream)) not in self._ready_waited:
            self.stream_wait(self.word(READY + peer), self.value, stream)
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
        compute.wait_stream(self.push_stream)
        compute.wait_stream(self.copy_stream)
        self.stall_if_a_peer_gave_up(compute)
        if self.base == GRAPH_BLOCK:
            self._zero_graph_flags(compute)
            self._count_replay(GRAPH_FINISHED, compute)
            self.base, self.value = 0, self.epoch
        else:
            self._progress(FINISHED, compute)

    def captured_call(self, compute: torch.cuda.Stream, finished: bool) -> None:
        """A captured call that does not go through ``begin``/``end`` (cta_pipeline_mlp's, which counts
        its epochs on the device) tells the watchdog where each replay starts and ends."""
        self._count_replay(GRAPH_FINISHED if finished else GRAPH_STARTED, compute)

    def stall_if_a_peer_gave_up(self, compute: torch.cuda.Stream) -> None:
        """End of every call: a peer that gave up a call sent garbage under valid flags, so
        ``compute`` stops here (until the watchdog fires and raises) instead of going on with it."""
        self.stream_wait(PEER_OK, 1, compute)

    def _calls_in_flight(self) -> tuple[int, int]:
        """(calls the GPU started, calls it finished): eager epochs plus captured replays (watchdog)."""
        s = self.status
        if not self._count_replays:  # (turned off mid-way: the counts may not pair up)
            return s[STARTED], s[FINISHED]
        return s[STARTED] + s[GRAPH_STARTED], s[FINISHED] + s[GRAPH_FINISHED]

    def _call_name(self, _started: int) -> str:
        s = self.status
        if s[STARTED] > s[FINISHED]:
            return self._names[s[STARTED] % 64] or "a symm call"
        return "a captured symm call (CUDA-graph replay)"

    def _count_replay(self, word: int, compute: torch.cuda.Stream) -> None:
        """A kernel on ``compute`` adds 1 to status word ``word`` (GRAPH_STARTED / GRAPH_FINISHED):
        captured, it counts every replay, which the watchdog then bounds like an eager call."""
        if not (self._watch_progress and self._count_replays):
            return
        from ..codegen import flags as _flags

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


def _before(seen: int, value: int) -> bool:
    """Whether a flag that reads ``seen`` is still short of ``value`` (int32 words compared as a
    stream wait does: ``(int32)(seen - value) < 0``)."""
    return (seen - value) % 2**32 >= 2**31


def describe_flag(word: int, nbands: int, ws: int) -> str:
    """What a stream wait on this rank's flag ``word`` (eager block) waits for, in words."""
    nbands = max(nbands, 1)
    if READY <= word < READY + WS_MAX:
        return f"rank {word - READY} to start this call (its READY flag)"
    if AG_ARRIVED <= word < RS_ARRIVED:
        p, b = divmod(word - AG_ARRIVED, nbands)
        return f"band {b} of rank {p}'s shard to arrive"
    for lo, hi, text in ((RS_ARRIVED, GATHERED, "band {b} of rank {p}'s partial (round {rnd}) to arrive"),
                         (GATHERED, DONE, "band {b} of rank {p}'s reduced rows (round {rnd}) to arrive"),
                         (DONE, COUNTERS, "this rank's own tiles of band {b} of chunk {p} (round {rnd}) to finish")):
        if lo <= word < hi:  # [(round * ws + p) * nbands + b]
            slot, b = divmod(word - lo, nbands)
            rnd, p = divmod(slot, max(ws, 1))
            return text.format(b=b, p=p, rnd=rnd)
    if MOE_ARRIVED <= word < MOE_RETURNED:
        return f"rank {word - MOE_ARRIVED}'s dispatched tokens to arrive"
    if MOE_RETURNED <= word < MOE_DONE:
        return f"rank {word - MOE_RETURNED}'s expert results for this rank's tokens to come back"
    if MOE_DONE <= word < MOE_COUNTERS:
        return f"this rank's own expert tiles for source position {word - MOE_DONE} to finish"
    if MOE_CAP <= word < MOE_CAP + WS_MAX:
        return f"rank {word - MOE_CAP}'s row count of x (MOE_CAP)"
    if word == PEER_OK:
        return "no peer to have given up a call (PEER_OK)"
    return "a flag of this op"


def status_error(words, group_name: str, timeout_s: float) -> SymmTimeoutError | None:
    """The exception that a kernel's status words ``[1, op, rank, flag, seen, epoch, ...]`` stand for."""
    if not words[0]:
        return None
    from ..codegen.flags import (MOE_CAP_FLAG_BASE, OP_AG_MM, OP_AR_ONESHOT, OP_CTA_COLLECT, OP_CTA_STAGE1, OP_CTA_TAIL,
                                 OP_MOE, OP_NAMES, STATUS_MISMATCH)

    kind, op, rank, flag, seen, epoch, nbands = (int(w) for w in words[:7])
    nbands = max(nbands, 1)
    if kind == STATUS_MISMATCH.value and op == OP_MOE.value:
        return SymmMismatchError(
            f"overlap symm: moe_experts on rank {rank} of group {group_name!r}: rank {flag - MOE_CAP_FLAG_BASE.value} "
            f"called it with {seen} token rows (x), this rank with {epoch}. The symm lowering sizes every rank's "
            "slots by x's rows, which must be the same on every rank of the group (docs/moe.md); this call's output "
            "is garbage and the group is unusable.")
    ws = _resolve_process_group(group_name).size() if group_name else 0
    if flag >= 2000:  # codegen.flags.GATHER_FLAG_BASE: an mm_ar copy tile
        slot, band = divmod(flag - 2000, nbands)
        what = (f"band {band} of rank {slot % ws}'s reduced rows (round {slot // ws}) to arrive" if ws else
                f"band {band} of gathered slot {slot} to arrive")
    elif flag >= 1000:
        what = f"rank {flag - 1000} to start this call (its READY flag)"
    elif op == OP_AG_MM.value:
        what = f"band {flag % nbands} of rank {flag // nbands}'s shard to arrive"
    elif op == OP_AR_ONESHOT.value:
        what = f"rank {flag}'s partial to arrive"
    elif op == OP_CTA_STAGE1.value and ws:
        block, j = divmod(flag, nbands)
        g, p = divmod(block, max(ws // 2, 1))
        what = f"K-chunk {j} of row group {g} from stage-0 rank {p} to arrive"
    elif op == OP_CTA_TAIL.value:
        p, m = divmod(flag, nbands)
        what = f"the tail (partial products) of row block {m} from stage-0 rank {p} to arrive"
    elif op == OP_CTA_COLLECT.value and ws:
        t, m = divmod(flag, nbands)
        what = f"row block {m} of the output from stage-1 rank {ws // 2 + t} to arrive"
    elif op == OP_MOE.value:
        if flag >= 200:
            what = f"rank {flag - 200}'s expert results for this rank's tokens to come back"
        elif flag >= 100:
            what = f"this rank's own expert tiles for source position {flag - 100} to finish"
        else:
            what = f"rank {flag}'s dispatched tokens to arrive"
    elif ws:
        slot = flag // nbands
        what = f"band {flag % nbands} of rank {slot % ws}'s partial (round {slot // ws}) to arrive"
    else:
        what = f"slot {flag} to arrive"
    return SymmTimeoutError(
        f"overlap symm: {OP_NAMES.get(op, op)} on rank {rank} of group {group_name!r} waited {timeout_s:g} s "
        f"(OVERLAP_TIMEOUT_S) on flag {flag}, for {what}: it read {seen}, expected >= {epoch}. "
        "A peer died, diverged (ran other ops) or is far behind; this call's output is garbage."
    )


_states: dict[tuple[str, int], GroupState] = {}
_fallback: dict[str, str] = {}  # group name -> why symm could not be set up
_states_lock = threading.Lock()


def state(group_name: str, device: torch.device) -> GroupState | None:
    """The group's state, set up on first use (collective); None where setup failed on any rank."""
    key = (group_name, device.index)
    if group_name in _fallback:
        return None
    st = _states.get(key)
    if st is not None:
        return st
    why = group_support(group_name)
    if why is None:
        try:
            with torch.cuda.device(device):
                st = GroupState(group_name, device)
        except SymmUnavailable as e:
            why = str(e)
    if why is not None:
        _fallback[group_name] = why
        log.warning("overlap symm: group %r uses the p2p lowering: %s", group_name, why)
        return None
    with _states_lock:
        _states[key] = st
    return st


def check_status() -> None:
    """Raise :class:`SymmTimeoutError` if a kernel of any group timed out (after a synchronize, this
    covers every call made so far)."""
    for st in list(_states.values()):
        st.check_status()


def release_all() -> None:
    """Free every group's buffers (at exit; call it yourself before destroying process groups)."""
    with _states_lock:
        states = list(_states.values())
        _states.clear()
    if states and torch.cuda.is_available():
        torch.cuda.synchronize()
    for st in states:
        try:
            st.release()
        except Exception as e:  # noqa: BLE001 - at exit the context may be gone already
            log.debug("overlap symm: release: %s", e)


atexit.register(release_all)


def _on_group_destroyed() -> None:
    """Hook for ``dist.destroy_process_group``: drop states whose group no longer exists."""
    dead = [k for k in _states if not _group_alive(k[0])]
    for k in dead:
        st = _states.pop(k)
        torch.cuda.synchronize(st.device)
        st.release()
    for name in [g for g in _support if not _group_alive(g)]:
        _support.pop(name, None)
        _shared_device.pop(name, None)
        _fallback.pop(name, None)


def drop_cuda_graphs() -> None:
    """Free the graphs of ``mode="reduce-overhead"`` (cudagraph trees) before the default group goes:
    a CUDA graph that captured NCCL work makes ``ncclCommDestroy`` hang (pytorch#115388), and under
    that mode the ``p2p`` fallback of the symm ops (like any collective) is captured. Seen on 2xH200:
    every replay right, then the ranks hung in ``destroy_process_group``. Only when Inductor's
    cudagraph trees were imported at all."""
    import gc
    import sys

    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees is None:
        return
    gc.collect()  # compiled functions dropped by the caller still hold their graphs until collected
    try:
        trees.reset_cudagraph_trees()
    except Exception as e:  # noqa: BLE001 - a failure here must not stop the shutdown
        log.warning("overlap: freeing CUDA graphs before destroy_process_group failed: %s", e)


def _group_alive(group_name: str) -> bool:
    try:
        _resolve_process_group(group_name)
        return True
    except Exception:  # noqa: BLE001
        return False


def _install_destroy_hook() -> None:
    original = dist.destroy_process_group
    if getattr(original, "_overlap_hooked", False):
        return

    def destroy_process_group(group=None):
        from . import p2p

        if group is None:
            drop_cuda_graphs()
            release_all()
            _support.clear()
            _shared_device.clear()
            _fallback.clear()
            p2p._GROUPS.clear()
            return original(group)
        result = original(group)
        _on_group_destroyed()
        p2p.forget_destroyed_groups()
        return result

    destroy_process_group._overlap_hooked = True
    destroy_process_group.__wrapped__ = original
    dist.destroy_process_group = destroy_process_group


_install_destroy_hook()
