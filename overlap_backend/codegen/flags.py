"""Flag waits and signals used inside the tile kernels, and the status word they report through.

A flag is an int32 in (local or peer) device memory. Writers store the call's *epoch* (a counter the
host increments per op call, identical on every rank), readers wait for ``flag >= epoch``: no reset
is ever needed and nothing synchronises with the host between calls.

Every wait is bounded. On timeout the first waiting CTA claims the *claim word* (device memory,
atomic) and writes ``[1, op, rank, flag index, value seen, epoch expected, bands per chunk]`` into the *report*
(pinned host memory mapped into the device: the host reads it without synchronising; no atomics
there, PCIe may not support them); every other waiting CTA sees the claimed word and stops waiting. The kernel then finishes (its output is garbage) instead of
trapping, which would kill the CUDA context; the host turns the word into an exception
(``runtime.symm.check_status``). The report's layout and codes: ``spec/symm_layout.py``.
"""

import triton
import triton.language as tl

from ..spec import symm_layout

# The report's layout and codes are the spec's (spec/symm_layout.py); constexpr globals so that
# kernels can use them.
OP_AG_MM = tl.constexpr(symm_layout.OP_AG_MM)
OP_MM_RS = tl.constexpr(symm_layout.OP_MM_RS)
OP_MM_AR = tl.constexpr(symm_layout.OP_MM_AR)
OP_AR_ONESHOT = tl.constexpr(symm_layout.OP_AR_ONESHOT)
OP_MOE = tl.constexpr(symm_layout.OP_MOE)
OP_CTA_STAGE1 = tl.constexpr(symm_layout.OP_CTA_STAGE1)
OP_CTA_COLLECT = tl.constexpr(symm_layout.OP_CTA_COLLECT)
OP_CTA_STAGE0 = tl.constexpr(symm_layout.OP_CTA_STAGE0)
OP_CTA_TAIL = tl.constexpr(symm_layout.OP_CTA_TAIL)
MOE_DONE_FLAG_BASE = tl.constexpr(symm_layout.MOE_DONE_FLAG_BASE)
MOE_RETURN_FLAG_BASE = tl.constexpr(symm_layout.MOE_RETURN_FLAG_BASE)
READY_FLAG_BASE = tl.constexpr(symm_layout.READY_FLAG_BASE)
GATHER_FLAG_BASE = tl.constexpr(symm_layout.GATHER_FLAG_BASE)
MOE_CAP_FLAG_BASE = tl.constexpr(symm_layout.MOE_CAP_FLAG_BASE)
STATUS_TIMEOUT = tl.constexpr(symm_layout.STATUS_TIMEOUT)
STATUS_MISMATCH = tl.constexpr(symm_layout.STATUS_MISMATCH)
RELEASED_VALUE = tl.constexpr(symm_layout.RELEASED)  # what a released group's flags read


@triton.jit
def _now_ns(TIMED: tl.constexpr):
    if TIMED:
        t = tl.inline_asm_elementwise(
            "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
        )
    else:
        t = tl.full([], 0, tl.int64)
    return t


@triton.jit
def wait_flag(flag_ptr, epoch, claim_ptr, report_ptr, op_code, rank, flag_index, nbands, timeout_ns,
              TIMED: tl.constexpr):
    """Spin until ``*flag_ptr >= epoch`` (acquire, system scope) or the wait is given up.

    ``TIMED`` measures the timeout with ``%globaltimer`` (GPU); without it (interpreter) the bound
    is ``timeout_ns // 1000`` polls. Returns 1 when the flag was seen, 0 when the wait gave up.
    """
    seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
    if seen < epoch:
        start = _now_ns(TIMED)
        polls = 0
        failed = tl.load(claim_ptr, volatile=True) != 0
        while (seen < epoch) & (failed == 0):
            seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
            polls += 1
            if TIMED:
                expired = _now_ns(TIMED) - start > timeout_ns
            else:
                expired = polls > timeout_ns // 1000
            if expired & (seen < epoch):
                claim_and_report(claim_ptr, report_ptr, STATUS_TIMEOUT, op_code, rank, flag_index, seen, epoch, nbands)
            failed = tl.load(claim_ptr, volatile=True) != 0
    return (seen >= epoch).to(tl.int32)


@triton.jit
def fence_proxy_async(INTERPRET: tl.constexpr):
    """Order this thread's earlier (generic-proxy) acquire before its later TMA (async-proxy) loads."""
    if not INTERPRET:
        tl.inline_asm_elementwise("fence.proxy.async.global; mov.u32 $0, 0;", "=r", [], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def bulk_stores_done(INTERPRET: tl.constexpr):
    """This CTA's TMA (bulk) stores are complete and ordered before its later generic-proxy accesses
    (the release that counts a tile): the issuing thread waits for its bulk groups and fences the
    async proxy, then the CTA synchronises so the thread that counts comes after it."""
    if not INTERPRET:
        tl.inline_asm_elementwise("cp.async.bulk.wait_group 0; fence.proxy.async.global; mov.u32 $0, 0;", "=r", [],
                                  dtype=tl.int32, is_pure=False, pack=1)
    tl.debug_barrier()


@triton.jit
def claim_and_report(claim_ptr, report_ptr, kind, op_code, rank, index, seen, expected, nbands):
    """The first claimer of this call writes ``[kind, op, rank, index, seen, expected, nbands]`` into
    the report: a wait that gave up (``STATUS_TIMEOUT``: flag index, value read, epoch awaited) or a
    peer's value that differs from this rank's (``STATUS_MISMATCH``: which value, the peer's, this
    rank's). Every wait of the call then stops; the host raises (``runtime.symm.check_status``)."""
    if tl.atomic_cas(claim_ptr, 0, 1, sem="relaxed", scope="gpu") == 0:
        tl.store(report_ptr + 1, op_code)
        tl.store(report_ptr + 2, rank)
        tl.store(report_ptr + 3, index)
        tl.store(report_ptr + 4, seen)
        tl.store(report_ptr + 5, expected)
        tl.store(report_ptr + 6, nbands)
        tl.store(report_ptr, kind)  # last: the host reads word 0 first


@triton.jit
def signal_flag(flag_ptr, epoch):
    """``*flag_ptr = epoch`` after every store this CTA made before (caller: ``tl.debug_barrier()``
    first, so that all threads' stores are ordered before this release)."""
    tl.atomic_xchg(flag_ptr, epoch, sem="release", scope="sys")


@triton.jit
def _count(counter_ptr, SYS: tl.constexpr, n=1):
    """Count one finished tile, or ``n`` (acq_rel: the tile's stores, and every earlier counted tile's, are
    ordered before whatever the last counter does next). System scope when the stores went to a
    peer's memory."""
    tl.debug_barrier()  # every thread's stores of this tile happen before the release below
    if SYS:
        old = tl.atomic_add(counter_ptr, n, sem="acq_rel", scope="sys")
    else:
        old = tl.atomic_add(counter_ptr, n, sem="acq_rel", scope="gpu")
    return old


@triton.jit
def count_local(counter_ptr):
    """``_count`` of a counter that only this GPU's CTAs add to (GPU scope): the value before."""
    return _count(counter_ptr, False)


@triton.jit
def count_tile_done(counter_ptr, done_flag_ptr, tiles_in_chunk, epoch, SYS: tl.constexpr = False, n=1):
    """One more finished tile of a chunk (or band), or ``n`` parts of ``tiles_in_chunk`` at once; the CTA that finishes
    it resets its counter (for the next call) and raises its flag (local, or a peer's) to ``epoch``."""
    old = _count(counter_ptr, SYS, n)
    if old + n == tiles_in_chunk:
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
        signal_flag(done_flag_ptr, epoch)


@triton.jit
def count_tiles_done(counter_ptr, done_flag_ptr, n, tiles_in_chunk, epoch):
    """``count_tile_done`` for ``n`` finished tiles of one chunk (or band) at once (local flag)."""
    tl.debug_barrier()  # every thread's stores of these tiles happen before the release below
    old = tl.atomic_add(counter_ptr, n, sem="acq_rel", scope="gpu")
    if old + n == tiles_in_chunk:
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
        signal_flag(done_flag_ptr, epoch)


@triton.jit
def count_bulk_stored(counters_ptr, done_ptr, index, n, tiles_in_chunk, epoch, INTERPRET: tl.constexpr):
    """``n`` tiles of chunk (or band) ``index`` (a counter and done-flag index) stored by TMA are finished: once
    this CTA's bulk stores completed, count them; the CTA that completes the chunk raises its done flag."""
    bulk_stores_done(INTERPRET)
    count_tiles_done(counters_ptr + index, done_ptr + index, n, tiles_in_chunk, epoch)


@triton.jit
def count_tile_done_to_ranks(counter_ptr, peer_flags_ptr, flag_word, tiles_in_chunk, epoch, first,
                             COUNT: tl.constexpr, WS: tl.constexpr, n=1):
    """As ``count_tile_done`` for tiles stored into other ranks' memory: the last tile raises word
    ``flag_word`` of ranks ``(first + q) % WS``, ``q < COUNT`` (``peer_flags_ptr``: every rank's flag
    buffer address)."""
    old = _count(counter_ptr, True, n)
    if old + n == tiles_in_chunk:
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
        for q in range(COUNT):
            flags = tl.load(peer_flags_ptr + (first + q) % WS).to(tl.pointer_type(tl.int32))
            signal_flag(flags + flag_word, epoch)


@triton.jit
def count_tile_done_to_peers(counter_ptr, peer_flags_ptr, flag_word, tiles_in_chunk, epoch, rank,
                             WS: tl.constexpr):
    """``count_tile_done_to_ranks`` for every peer of ``rank``."""
    count_tile_done_to_ranks(counter_ptr, peer_flags_ptr, flag_word, tiles_in_chunk, epoch, rank + 1, WS - 1, WS)


@triton.jit
def bump_kernel(word_ptr):
    """``*word_ptr += 1`` (one program, pinned host memory): a captured call's progress for the
    watchdog (runtime/watchdog.py). A stream write would bake its value into the graph; this counts
    every replay."""
    tl.store(word_ptr, tl.load(word_ptr, volatile=True) + 1)


def launch_bump(word_ptr) -> None:
    """On the current stream (``word_ptr``: a ``DevicePointer`` into the status words)."""
    from . import launcher

    launcher.launch(bump_kernel, (1,), word_ptr, num_warps=1)
