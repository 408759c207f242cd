"""CTA-pipeline flags: one-program flag kernels for the cuBLAS forms of the stages (``runtime/cta_cublas.py``),
and the count of stage 0's finished tiles per (row group, K-chunk) that its Triton and Gluon kernels share.

A call captured in a CUDA graph counts its epoch on the device (``cta.begin_kernel``): a stream
wait or write would bake one value into the graph, so between its cuBLAS GEMMs a captured call
waits with ``wait_kernel`` (bounded, reported like every kernel's wait). ``signal_kernel`` raises a
run of flag words in every peer to the epoch, in eager calls too: one launch instead of a stream
write per row block and peer. Word indices and counts are ``do_not_specialize``, so each kernel
has one variant per constexpr set (``codegen/launcher.py``: preloading).
"""

import triton
import triton.language as tl

from . import launcher
from .flags import count_tile_done, count_tile_done_to_ranks, signal_flag, wait_flag


@triton.jit(do_not_specialize=["first", "count", "skip", "epoch_word", "timeout_ns", "rank", "op_code", "index0",
                               "nbands"])
def wait_kernel(flags_ptr, first, count, skip, epoch_word, claim_ptr, report_ptr, timeout_ns, rank, op_code, index0,
                nbands, TIMED: tl.constexpr):
    """Wait until words ``first + i`` (``i < count``, ``i != skip``) of this rank's flags reach the
    epoch in word ``epoch_word``; a wait that gives up reports flag ``index0 + i``."""
    epoch = tl.load(flags_ptr + epoch_word, volatile=True)
    for i in range(count):
        if i != skip:
            wait_flag(flags_ptr + first + i, epoch, claim_ptr, report_ptr, op_code, rank, index0 + i, nbands,
                      timeout_ns, TIMED)


@triton.jit(do_not_specialize=["first", "count", "epoch_word", "rank"])
def signal_kernel(flags_ptr, peer_flags_ptr, first, count, epoch_word, rank, WS: tl.constexpr):
    """Words ``[first, first + count)`` of every peer's flags = the epoch in this rank's word
    ``epoch_word`` (release, system scope: after everything earlier on this stream)."""
    epoch = tl.load(flags_ptr + epoch_word, volatile=True)
    for q in range(1, WS):
        flags = tl.load(peer_flags_ptr + (rank + q) % WS).to(tl.pointer_type(tl.int32))
        for i in range(count):
            signal_flag(flags + first + i, epoch)


def launch_wait(flags, first, count, epoch_word, status, timeout_ns, rank, op_code, index0, nbands, skip=-1,
                timed=None):
    """``flags``: this rank's flag buffer (word 0); ``status``: (claim word, report); ``timed``: the
    bound in GPU time (default: but under the interpreter, which bounds the polls)."""
    timed = not launcher.interpreting() if timed is None else timed
    launcher.launch(wait_kernel, (1,), flags, first, count, skip, epoch_word, *status, timeout_ns, rank, op_code,
                    index0, nbands, TIMED=timed, num_warps=1)


def launch_signal(flags, peer_flags, first, count, epoch_word, rank, ws):
    """``peer_flags``: every rank's flag buffer address (int64 device tensor)."""
    launcher.launch(signal_kernel, (1,), flags, peer_flags, first, count, epoch_word, rank, WS=ws, num_warps=1)


@triton.jit
def count_chunk_tile(counters_ptr, done_ptr, peer_flags_ptr, a_flag_word, epoch, pid_m, pid_n, tiles_m, tiles_n,
                     tiles_ship, tail_group, tiles_per_chunk, nch, producer, first_consumer, pieces,
                     TP: tl.constexpr, GROUP_M: tl.constexpr, STAGED: tl.constexpr, n=1):
    """``n`` more stored pieces of a tile of (group of pid_m, chunk of pid_n), a tile in ``pieces`` (1: whole tiles,
    ``stage0_split_sum_kernel``: pieces of rows; a whole tile beside those: ``n = pieces``); see
    ``cta.stage0_kernel``."""
    g = pid_m // GROUP_M
    j = pid_n // tiles_per_chunk
    shipped = tl.where(g == tail_group, tiles_ship, tiles_n)  # column tiles this group ships
    tiles = tl.minimum(GROUP_M, tiles_m - g * GROUP_M) * tl.minimum(tiles_per_chunk, shipped - j * tiles_per_chunk)
    tiles = tiles * pieces
    if STAGED:
        count_tile_done(counters_ptr + g * nch + j, done_ptr + g * nch + j, tiles, epoch, SYS=True, n=n)
    else:
        count_tile_done_to_ranks(counters_ptr + g * nch + j, peer_flags_ptr, a_flag_word + (g * TP + producer) * nch + j,
                                 tiles, epoch, first_consumer, TP, 2 * TP, n=n)
