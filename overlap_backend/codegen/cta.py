"""CTA-pipelining kernels: the two GEMMs of a tensor-parallel MLP on different GPUs, tile by tile.

Ranks form two *stages* of ``TP`` ranks each (stage 0: ranks ``0..TP-1``, stage 1: ``TP..2TP-1``).

- **Stage 0** (``stage0_kernel``, producer ``p`` of ``TP``): ``A[:, p*Fp:(p+1)*Fp] = act(x @ W1_p)``
  tile by tile. Each tile is stored straight into every stage-1 rank's receive buffer ``A [M, F]``;
  the tiles of one (row block, K-chunk) are counted (system-scope acq_rel) and the last one raises
  that chunk's flag in every stage-1 rank's flag buffer (release).
- **Stage 1** (``stage1_kernel``, consumer ``t`` of ``TP``): ``Y[:, t*Ns:(t+1)*Ns] = A @ W2_t + b2``.
  Each CTA walks K in *arrival order* (chunk j of producer 0, of producer 1, ..., then chunk j+1)
  and waits for each chunk's flag just before reading it: a row block starts as soon as its first
  chunk exists. A wait never sits inside a software-pipelined K-loop (loads issued ahead would
  overtake it): after each wait, the chunks already here run through one such loop, up to the
  first one not here yet. Finished tiles go into this rank's output
  and into every other rank's ``Y`` buffer; the last tile of a row block raises that row block's
  flag on every other rank.
- ``collect_kernel`` (every rank but the tile's owner): waits per (consumer, row block) and copies
  those ``Y`` rows into the output, while stage 1 is still computing later row blocks.

Tile order on both stages: groups of ``GROUP_M`` row blocks, the tiles of a group column by column
(``grouped_tile``), so that stage 0 finishes the K-chunks of a group in the order stage 1 reads them.
Reading data that a peer wrote (generic-proxy stores) through TMA (the async proxy) needs a proxy
fence after the acquiring wait.
"""

import torch
import triton
import triton.language as tl

from ..spec import knobs
from . import launcher
from .cta_flags import count_chunk_tile
from .flags import (OP_CTA_COLLECT, OP_CTA_STAGE0, OP_CTA_STAGE1, OP_CTA_TAIL, READY_FLAG_BASE, bulk_stores_done,
                    count_local, count_tile_done_to_ranks, fence_proxy_async, signal_flag, wait_flag)
from .tiles import add_bias, b_descriptor, grouped_tile, peer_buffer

ACT_GELU = 0
ACT_GELU_TANH = 1
ACT_SWIGLU = 2
ACTIVATIONS = {("gelu", "none"): ACT_GELU, ("gelu", "tanh"): ACT_GELU_TANH, ("swiglu", "none"): ACT_SWIGLU}


@triton.jit
def _activation(h, g, ACT: tl.constexpr):
    """act(h) in float32; SwiGLU: ``silu(h) * g``."""
    if ACT == 0:
        out = 0.5 * h * (1.0 + tl.math.erf(h * 0.7071067811865476))
    elif ACT == 1:
        u = 0.7978845608028654 * (h + 0.044715 * h * h * h)
        out = 0.5 * h * (1.0 + (2.0 * tl.sigmoid(2.0 * u) - 1.0))
    else:
        out = h * tl.sigmoid(h) * g
    return out


@triton.jit
def _act_tile(acc1, acc3, b1_ptr, b3_ptr, offs_n, Fp, ACT: tl.constexpr, HAS_B1: tl.constexpr, HAS_B3: tl.constexpr):
    """act(acc1 (+ b1) [, acc3 (+ b3)]) in float32: a stage-0 tile's epilogue before its stores."""
    acc1 = add_bias(acc1, b1_ptr, offs_n, Fp, HAS_B1)
    if ACT == 2:
        acc3 = add_bias(acc3, b3_ptr, offs_n, Fp, HAS_B3)
    return _activation(acc1, acc3, ACT)


@triton.jit
def _keep_tail_tile(keep_ptr, act, offs_m, offs_n, M, Fp, Fship, m0):
    """A tail tile into ``keep`` ``[Mp - m0, Fp - Fship]`` (kept here, never shipped or counted)."""
    mask = (offs_m < M)[:, None] & (offs_n < Fp)[None, :]
    tl.store(keep_ptr + (offs_m - m0).to(tl.int64)[:, None] * (Fp - Fship) + (offs_n - Fship)[None, :], act, mask=mask)


@triton.jit
def _mainloop2(x_desc, x_row, w1_desc, w3_desc, off_n, k_first, k_last, acc1, acc3, BK: tl.constexpr,
               DUAL: tl.constexpr, PRECISION: tl.constexpr):
    """acc1 += x @ W1 tile (and acc3 += x @ W3 tile, the same x tile, when DUAL) over K-steps
    ``[k_first, k_last)`` of BK."""
    for k in range(k_first, k_last):
        a = x_desc.load([x_row, k * BK])
        acc1 = tl.dot(a, w1_desc.load([k * BK, off_n]), acc1, input_precision=PRECISION)
        if DUAL:
            acc3 = tl.dot(a, w3_desc.load([k * BK, off_n]), acc3, input_precision=PRECISION)
    return acc1, acc3


@triton.jit
def stage0_kernel(
    x_ptr, w1_ptr, b1_ptr, w3_ptr, b3_ptr, stage_ptr, peer_data_ptr, peer_flags_ptr, counters_ptr, done_ptr,
    epoch_ptr, ready_ptr, claim_ptr, report_ptr, timeout_ns, rank,
    M, Mp, H, Fp, ldw, Fship, keep_ptr, tail_group, producer, kchunk, nch, a_flag_word, first_consumer,
    TP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    ACT: tl.constexpr, HAS_B1: tl.constexpr, HAS_B3: tl.constexpr, STAGED: tl.constexpr, WAIT_READY: tl.constexpr,
    PRECISION: tl.constexpr, TIMED: tl.constexpr, COUNT_FIRST_AT_ONCE: tl.constexpr = False,
    TMA_STORE: tl.constexpr = False, INTERPRET: tl.constexpr = False, split_tiles=0, SPLIT_LAST: tl.constexpr = False,
    split_ptr=None, split_counters_ptr=None, split_k=1, SPLIT_K: tl.constexpr = False,  # (1 without SPLIT_K)
    SUM_PAIRS: tl.constexpr = False, SPLIT_FIXUP: tl.constexpr = False, STREAM_K: tl.constexpr = False,
    sk_tiles=0, sk_slots=1, units=1,
):
    """``A[:, producer*Fp + n] = act(x @ w1 (+ b1) [, x @ w3 (+ b3)])``, chunk-major.

    ``w1``/``w3``: [H, Fp], rows ``ldw`` elements apart (this producer's columns: a window of the
    placed weights). A is kept *chunk-major*: chunk j
    (columns ``[j*kchunk, (j+1)*kchunk)`` of this producer) is a ``[Mp, kchunk]`` block
    (``Mp`` = M rounded up to BM), so that the rows of a group of one chunk are contiguous.
    Counters/flags are per (group of GROUP_M row blocks g, chunk j), 0 between calls.

    - ``STAGED``: blocks go to the local ``stage_ptr`` ``[nch, Mp, kchunk]``; the last tile of
      (g, j) raises the local ``done_ptr[g * nch + j]`` (the host's copy engine ships it).
      ``TMA_STORE``: whole tiles by TMA (rows past M and columns past the shipped ones land in the
      block's padding, which nothing reads), each counted only once its bulk store completed;
    - else: blocks go to block ``producer * nch + j`` of every consumer's buffer (offset 0 of its
      data buffer, ``[TP * nch, Mp, kchunk]``), and the last tile raises word
      ``a_flag_word + (g * TP + producer) * nch + j`` of every consumer's flags.

    The epoch is read from ``epoch_ptr`` (written before the launch, by the host or by
    ``begin_kernel`` in a captured graph). ``WAIT_READY``: first wait until every consumer's
    ``ready_ptr[consumer] >= epoch`` (it started this call; the host waits on the stream otherwise).

    In row group ``tail_group`` only the first ``Fship`` columns (whole tiles) are shipped and
    counted (every column in the other groups). The others, this producer's *tail* (``tail_kernel``
    multiplies them by their W2 rows here), go to the local ``keep_ptr`` ``[Mp - m0, Fp - Fship]``
    (``m0``: the group's first row): only the last group has a tail, so that no earlier row block
    waits for what stage 0 makes at the end.

    ``SPLIT_LAST``: the last ``split_tiles`` tiles (all of them tail tiles, at most half a round:
    ``launch_stage0`` decides) are made as two half-width tiles each, by twice as many programs, so
    that the final, partial round of tiles takes about half a tile's time instead of a whole one.

    ``SPLIT_K`` (few tiles: decode sizes; never with ``SPLIT_LAST``): each tile's K-steps in
    ``split_k`` contiguous runs, one work item each, added as stage 1's are (``_add_split_partials``:
    ``split_ptr`` float32 ``[tiles, split_k, 1 + DUAL, BM, BN]``, ``split_counters_ptr`` one local
    int32 per tile, 0 between calls); the run that finishes last makes the tile's epilogue. ``SPLIT_FIXUP``: every run
    stores its slot and stops; ``stage0_split_sum_kernel``, launched after this kernel, adds the slots and makes the
    epilogues. ``STREAM_K``: the programs' equal shares of tiles' K-steps (``_stream_k_runs``, ``sk_slots`` slots a
    tile), the fix-up kernel after this one adding them: with ``SPLIT_K`` (and ``SPLIT_FIXUP``) every tile's, instead of
    ``split_k`` runs a tile; without, the last ``sk_tiles`` tiles' of the order (the last, partial round's), after
    the others, which count ``units`` pieces each (the fix-up's pieces a tile).
    """
    DUAL: tl.constexpr = ACT == 2
    epoch = tl.load(epoch_ptr, volatile=True)
    if WAIT_READY:  # (staged: the copy engine ships the tiles after their done flags, so after this)
        for q in range(TP):
            wait_flag(ready_ptr + first_consumer + q, epoch, claim_ptr, report_ptr, OP_CTA_STAGE0, rank,
                      q + first_consumer + READY_FLAG_BASE, 1, timeout_ns, TIMED)
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(Fp, BN)
    tiles_ship = tl.cdiv(Fship, BN)
    m0 = tail_group * GROUP_M * BM
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, H], strides=[H, 1], block_shape=[BM, BK])
    w1_desc = tl.make_tensor_descriptor(w1_ptr, shape=[H, Fp], strides=[ldw, 1], block_shape=[BK, BN])
    w3_desc = tl.make_tensor_descriptor(w3_ptr, shape=[H, Fp], strides=[ldw, 1], block_shape=[BK, BN])
    if TMA_STORE:
        stage_desc = tl.make_tensor_descriptor(stage_ptr, shape=[nch * Mp, kchunk], strides=[kchunk, 1],
                                               block_shape=[BM, BN])
    else:
        stage_desc = x_desc  # (not used)
    prev_m = -1  # the tile stored in the previous iteration, counted after this one's main loop
    prev_n = 0
    # (tl.range(..., flatten=True), fusing this loop with the K-loop, made stage 0 3x slower with
    # Triton 3.6 on H200: bench/results/cta_h200x2_2026-11-30/stage0_probes)
    wide_tiles = tiles_m * tiles_n - split_tiles if SPLIT_LAST else tiles_m * tiles_n
    steps = tl.cdiv(H, BK)
    whole_tiles = wide_tiles  # (the tiles of the loop below)
    if STREAM_K:
        if SPLIT_K:
            _stream_k_runs(x_desc, w1_desc, w3_desc, split_ptr, M, tiles_m, tiles_n, 0, wide_tiles, steps, sk_slots,
                           BM, BN, BK, GROUP_M, DUAL, PRECISION)
            whole_tiles = 0
        else:
            whole_tiles = wide_tiles - sk_tiles
    for item in range(tl.program_id(0), whole_tiles * split_k, tl.num_programs(0)):
        if SPLIT_K:
            tile = item // split_k
            split = item % split_k
            k_first = split * steps // split_k
            k_last = (split + 1) * steps // split_k
        else:
            tile = item
            k_first = 0
            k_last = steps
        pid_m, pid_n = grouped_tile(tile, tiles_m, tiles_n, GROUP_M)
        acc1 = tl.zeros((BM, BN), dtype=tl.float32)
        acc3 = tl.zeros((BM, BN), dtype=tl.float32)
        acc1, acc3 = _mainloop2(x_desc, pid_m * BM, w1_desc, w3_desc, pid_n * BN, k_first, k_last, acc1, acc3, BK,
                                DUAL, PRECISION)
        # Count the previous tile now: its stores had a whole main loop to drain, so the release
        # below does not stall this CTA on them (counting right after the stores did).
        if prev_m >= 0:
            if TMA_STORE:
                bulk_stores_done(INTERPRET)  # long done by now: a main loop ran since
            count_chunk_tile(counters_ptr, done_ptr, peer_flags_ptr, a_flag_word, epoch, prev_m, prev_n, tiles_m,
                              tiles_n, tiles_ship, tail_group, kchunk // BN, nch, producer, first_consumer, units, TP,
                              GROUP_M, STAGED, n=units)
        finishes = True
        if SPLIT_K:
            prev_m = -1  # (counted above; a run that does not finish its tile stores nothing to count)
            acc1, acc3, finishes = _split_run(acc1, acc3, split_ptr, split_counters_ptr, tile, split, split_k, split_k,
                                              pid_m * BM + tl.arange(0, BM) < M, BM, BN, DUAL, SUM_PAIRS, SPLIT_FIXUP)
        if finishes:
            prev_m, prev_n = _stage0_epilogue(
                acc1, acc3, x_ptr, b1_ptr, b3_ptr, stage_ptr, peer_data_ptr, peer_flags_ptr, counters_ptr, done_ptr,
                keep_ptr, stage_desc, epoch, pid_m, pid_n, M, Mp, Fp, Fship, tiles_m, tiles_n,
                tiles_ship, tail_group, m0, producer, kchunk, nch, a_flag_word, first_consumer, units, TP, BM, BN,
                GROUP_M, ACT, HAS_B1, HAS_B3, STAGED, TMA_STORE, COUNT_FIRST_AT_ONCE, INTERPRET)
    if SPLIT_LAST:
        _split_tail_tiles(x_desc, w1_ptr, w3_ptr, b1_ptr, b3_ptr, keep_ptr, M, H, Fp, ldw, Fship, m0, wide_tiles,
                          split_tiles, tiles_m, tiles_n, BM, BN, BK, GROUP_M, ACT, HAS_B1, HAS_B3, PRECISION)
    if prev_m >= 0:
        if TMA_STORE:
            bulk_stores_done(INTERPRET)
        count_chunk_tile(counters_ptr, done_ptr, peer_flags_ptr, a_flag_word, epoch, prev_m, prev_n, tiles_m,
                          tiles_n, tiles_ship, tail_group, kchunk // BN, nch, producer, first_consumer, units, TP,
                          GROUP_M, STAGED, n=units)
    if STREAM_K:
        if not SPLIT_K:  # the last round's tiles, after the whole ones were counted
            _stream_k_runs(x_desc, w1_desc, w3_desc, split_ptr, M, tiles_m, tiles_n, whole_tiles, sk_tiles, steps,
                           sk_slots, BM, BN, BK, GROUP_M, DUAL, PRECISION)


@triton.jit
def _stage0_epilogue(acc1, acc3, x_ptr, b1_ptr, b3_ptr, stage_ptr, peer_data_ptr, peer_flags_ptr, counters_ptr,
                     done_ptr, keep_ptr, stage_desc, epoch, pid_m, pid_n, M, Mp, Fp, Fship, tiles_m, tiles_n, tiles_ship,
                     tail_group, m0, producer, kchunk, nch, a_flag_word, first_consumer, units, TP: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr, ACT: tl.constexpr,
                     HAS_B1: tl.constexpr, HAS_B3: tl.constexpr, STAGED: tl.constexpr, TMA_STORE: tl.constexpr,
                     COUNT_FIRST_AT_ONCE: tl.constexpr, INTERPRET: tl.constexpr):
    """A finished stage-0 tile: its activation, kept (a tail tile) or stored into its K-chunk's
    block; (row block, column block) of the tile left to count after the next main loop, row
    block -1 for none (a tail tile, or one counted here: ``COUNT_FIRST_AT_ONCE``)."""
    prev_m = -1
    prev_n = pid_n
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    act = _act_tile(acc1, acc3, b1_ptr, b3_ptr, offs_n, Fp, ACT, HAS_B1, HAS_B3).to(x_ptr.dtype.element_ty)
    in_tail_group = pid_m // GROUP_M == tail_group
    if in_tail_group & (pid_n >= tiles_ship):  # the tail: kept here, not counted
        _keep_tail_tile(keep_ptr, act, offs_m, offs_n, M, Fp, Fship, m0)
    else:
        if TMA_STORE:
            j = (pid_n * BN) // kchunk  # a tile never straddles two chunks (kchunk % BN == 0)
            stage_desc.store([j * Mp + pid_m * BM, pid_n * BN - j * kchunk], act)
        else:
            _store_chunk_rows(act, stage_ptr, peer_data_ptr, offs_m, offs_n, pid_n * BN, M, Mp, Fp, Fship,
                              in_tail_group, producer, kchunk, nch, first_consumer, TP, STAGED)
        prev_m = pid_m
        if COUNT_FIRST_AT_ONCE:
            # The first row group's chunks are what stage 1 waits for first (the pipeline's fill):
            # counted right after their stores instead of a main loop later.
            if pid_m < GROUP_M:
                if TMA_STORE:
                    bulk_stores_done(INTERPRET)
                count_chunk_tile(counters_ptr, done_ptr, peer_flags_ptr, a_flag_word, epoch, pid_m, pid_n,
                                  tiles_m, tiles_n, tiles_ship, tail_group, kchunk // BN, nch, producer,
                                  first_consumer, units, TP, GROUP_M, STAGED, n=units)
                prev_m = -1
    return prev_m, prev_n


@triton.jit
def _store_chunk_rows(act, stage_ptr, peer_data_ptr, offs_m, offs_n, col0, M, Mp, Fp, Fship, in_tail_group, producer,
                      kchunk, nch, first_consumer, TP: tl.constexpr, STAGED: tl.constexpr):
    """Rows ``offs_m`` of a shipped stage-0 tile (columns ``offs_n``, from ``col0``) by pointer stores into its
    K-chunk's block: the local staging buffer (``STAGED``) or every consumer's buffer."""
    j = col0 // kchunk  # a tile never straddles two chunks (kchunk % BN == 0)
    mask = (offs_m < M)[:, None] & (offs_n < tl.where(in_tail_group, Fship, Fp))[None, :]
    rel = (j * Mp + offs_m).to(tl.int64)[:, None] * kchunk + (offs_n - j * kchunk)[None, :]
    if STAGED:
        tl.store(stage_ptr + rel, act, mask=mask)
    else:
        for q in range(TP):
            buf = peer_buffer(peer_data_ptr, first_consumer + q, 0, stage_ptr.dtype.element_ty)
            tl.store(buf + producer * nch * Mp * kchunk + rel, act, mask=mask)


@triton.jit
def _stream_k_owner(step, programs, total):
    """The program whose share ``[p * total // programs, (p + 1) * total // programs)`` of the K-steps of all tiles
    (tile t's are ``[t * steps, (t + 1) * steps)``) holds ``step``: the last p whose share starts at or before it."""
    return (((step + 1).to(tl.int64) * programs - 1) // total).to(tl.int32)


@triton.jit
def _stream_k_runs(x_desc, w1_desc, w3_desc, split_ptr, M, tiles_m, tiles_n, first_tile, n_tiles, steps,
                   slots_per_tile, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                   DUAL: tl.constexpr, PRECISION: tl.constexpr):
    """Stream-K: this program's equal share of the K-steps of tiles ``[first_tile, first_tile + n_tiles)`` of the
    order, one piece a tile it meets, each piece's sums into slot ``program - the tile's first program`` (the piece's
    step where shares are one step or none) of the tile's (counted from ``first_tile``), for
    ``stage0_split_sum_kernel`` to add: every SM busy to the end, where whole tiles or runs leave the last round's SMs
    idle."""
    programs = tl.num_programs(0)
    pid = tl.program_id(0)
    total = n_tiles * steps
    start = (pid.to(tl.int64) * total // programs).to(tl.int32)
    end = ((pid + 1).to(tl.int64) * total // programs).to(tl.int32)
    for tile in range(start // steps, tl.where(end > start, tl.cdiv(end, steps), start // steps)):
        k_first = tl.maximum(start - tile * steps, 0)
        k_last = tl.minimum(end - tile * steps, steps)
        pid_m, pid_n = grouped_tile(first_tile + tile, tiles_m, tiles_n, GROUP_M)
        acc1 = tl.zeros((BM, BN), dtype=tl.float32)
        acc3 = tl.zeros((BM, BN), dtype=tl.float32)
        acc1, acc3 = _mainloop2(x_desc, pid_m * BM, w1_desc, w3_desc, pid_n * BN, k_first, k_last, acc1, acc3, BK,
                                DUAL, PRECISION)
        # (fewer steps than programs: a share is one step or none, and a piece's slot its step)
        slot = tl.where(total >= programs, pid - _stream_k_owner(tile * steps, programs, total), k_first)
        _store_run_slot(acc1, acc3, split_ptr, tile, slot, slots_per_tile, pid_m * BM + tl.arange(0, BM) < M, BM, BN,
                        DUAL)


@triton.jit
def stage0_split_sum_kernel(
    split_ptr, x_ptr, b1_ptr, b3_ptr, stage_ptr, peer_data_ptr, peer_flags_ptr, counters_ptr, done_ptr, keep_ptr,
    epoch_ptr, M, Mp, Fp, Fship, tail_group, producer, kchunk, nch, a_flag_word, first_consumer, split_k, steps,
    programs, tile0,
    TP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr, ROWS: tl.constexpr,
    ACT: tl.constexpr, HAS_B1: tl.constexpr, HAS_B3: tl.constexpr, STAGED: tl.constexpr, STREAM_K: tl.constexpr = False,
):
    """``stage0_kernel``'s split tiles finished after it (its ``SPLIT_FIXUP``): one program per ``ROWS`` rows of a
    tile adds those rows of the tile's runs' slots in run order (the bits of the in-kernel sum), makes their
    activation and stores them where the tile's epilogue would (pointer stores; a tail tile's into ``keep_ptr``),
    then counts them: a (row group, K-chunk) flag rises after every piece of its tiles. Every SM takes part in the
    sums that the last run of each tile made alone in the kernel. Its tiles: ``tile0`` on (the grid's). ``STREAM_K``: a
    tile's slots are the pieces of it that the ``programs`` stream-K shares made (``steps`` K-steps a tile),
    ``split_k`` slots apart."""
    DUAL: tl.constexpr = ACT == 2
    SLOT: tl.constexpr = BM * BN * (2 if DUAL else 1)
    pieces: tl.constexpr = BM // ROWS
    epoch = tl.load(epoch_ptr, volatile=True)
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(Fp, BN)
    tiles_ship = tl.cdiv(Fship, BN)
    tile = tl.program_id(0) // pieces  # (counted from tile0)
    piece = tl.program_id(0) % pieces
    pid_m, pid_n = grouped_tile(tile0 + tile, tiles_m, tiles_n, GROUP_M)
    offs_m = pid_m * BM + piece * ROWS + tl.arange(0, ROWS)
    offs_n = pid_n * BN + tl.arange(0, BN)
    slots = _split_slots(split_ptr, tile, split_k, piece * ROWS, ROWS, BM, BN, DUAL)
    runs = split_k
    if STREAM_K:
        total = tl.num_programs(0) // pieces * steps
        runs = tl.where(total >= programs, _stream_k_owner(tile * steps + steps - 1, programs, total)
                        - _stream_k_owner(tile * steps, programs, total) + 1, steps)
    acc1, acc3 = _sum_slots(slots, runs, (offs_m < M)[:, None], ROWS, BN, SLOT, BM * BN, DUAL)
    act = _act_tile(acc1, acc3, b1_ptr, b3_ptr, offs_n, Fp, ACT, HAS_B1, HAS_B3).to(x_ptr.dtype.element_ty)
    in_tail_group = pid_m // GROUP_M == tail_group
    if in_tail_group & (pid_n >= tiles_ship):  # the tail: kept here, not counted
        _keep_tail_tile(keep_ptr, act, offs_m, offs_n, M, Fp, Fship, tail_group * GROUP_M * BM)
    else:
        _store_chunk_rows(act, stage_ptr, peer_data_ptr, offs_m, offs_n, pid_n * BN, M, Mp, Fp, Fship, in_tail_group,
                          producer, kchunk, nch, first_consumer, TP, STAGED)
        count_chunk_tile(counters_ptr, done_ptr, peer_flags_ptr, a_flag_word, epoch, pid_m, pid_n, tiles_m, tiles_n,
                          tiles_ship, tail_group, kchunk // BN, nch, producer, first_consumer, pieces, TP, GROUP_M,
                          STAGED)


@triton.jit
def _split_tail_tiles(x_desc, w1_ptr, w3_ptr, b1_ptr, b3_ptr, keep_ptr, M, H, Fp, ldw, Fship, m0, first, count,
                      tiles_m, tiles_n, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                      ACT: tl.constexpr, HAS_B1: tl.constexpr, HAS_B3: tl.constexpr, PRECISION: tl.constexpr):
    """Tiles ``[first, first + count)`` of stage 0's order, all tail tiles (kept, not counted), as
    ``2 * count`` half-width tiles spread over the programs (see ``stage0_kernel``'s SPLIT_LAST)."""
    HALF: tl.constexpr = BN // 2
    DUAL: tl.constexpr = ACT == 2
    w1_desc = tl.make_tensor_descriptor(w1_ptr, shape=[H, Fp], strides=[ldw, 1], block_shape=[BK, HALF])
    w3_desc = tl.make_tensor_descriptor(w3_ptr, shape=[H, Fp], strides=[ldw, 1], block_shape=[BK, HALF])
    for h in range(tl.program_id(0), 2 * count, tl.num_programs(0)):
        pid_m, pid_n = grouped_tile(first + h // 2, tiles_m, tiles_n, GROUP_M)
        off_n = pid_n * BN + (h % 2) * HALF
        acc1 = tl.zeros((BM, HALF), dtype=tl.float32)
        acc3 = tl.zeros((BM, HALF), dtype=tl.float32)
        acc1, acc3 = _mainloop2(x_desc, pid_m * BM, w1_desc, w3_desc, off_n, 0, tl.cdiv(H, BK), acc1, acc3, BK, DUAL,
                                PRECISION)
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = off_n + tl.arange(0, HALF)
        act = _act_tile(acc1, acc3, b1_ptr, b3_ptr, offs_n, Fp, ACT, HAS_B1, HAS_B3).to(keep_ptr.dtype.element_ty)
        _keep_tail_tile(keep_ptr, act, offs_m, offs_n, M, Fp, Fship, m0)


@triton.jit
def tail_kernel(keep_ptr, w2_ptr, peer_data_ptr, peer_flags_ptr, part_offset, counters_ptr, epoch_ptr, ready_ptr,
                claim_ptr, report_ptr, timeout_ns, rank, M, m0, dk, Ns, producer, tail_flag_word,
                TP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, WAIT_READY: tl.constexpr,
                PRECISION: tl.constexpr, TIMED: tl.constexpr, KEEP_LOCAL: tl.constexpr = False):
    """Stage-0 producer ``producer``'s tail: ``P = keep @ w2`` for rows ``[m0, M)`` (the last row
    group's; ``keep``: its last ``dk`` columns of A, ``[M - m0, dk]``; ``w2``: their rows,
    ``[dk, TP * Ns]``). Columns ``[t*Ns, (t+1)*Ns)`` of P go to
    stage-1 rank t's data buffer, slot ``producer`` at byte ``part_offset`` (``[TP, M, Ns]``), which
    adds them in its epilogue; the last tile of (t, row block m) raises word
    ``tail_flag_word + producer * tiles_m + m`` of rank t's flags (counters ``[t * tiles_m + m]``,
    local). Stage 1 then does not wait for the columns stage 0 makes last: no pipeline drain.
    ``WAIT_READY``: wait for every stage-1 rank's READY first (captured graphs). ``KEEP_LOCAL``
    (``TP == 1``): P also goes to this rank's own buffer at ``part_offset``, where its collect adds
    it to stage 1's rows (``stage1_kernel``'s ``SHIP_BEFORE_TAIL``)."""
    epoch = tl.load(epoch_ptr, volatile=True)
    if WAIT_READY:
        for q in range(TP):
            wait_flag(ready_ptr + TP + q, epoch, claim_ptr, report_ptr, OP_CTA_STAGE0, rank, q + TP + READY_FLAG_BASE, 1,
                      timeout_ns, TIMED)
    tiles_m = tl.cdiv(M, BM)  # flags and counters are per row block of all M
    tiles_mt = tl.cdiv(M - m0, BM)  # the tail's row blocks (m0: a whole number of blocks)
    tiles_n = tl.cdiv(Ns, BN)
    k_desc = tl.make_tensor_descriptor(keep_ptr, shape=[M - m0, dk], strides=[dk, 1], block_shape=[BM, BK])
    w2_desc = tl.make_tensor_descriptor(w2_ptr, shape=[dk, TP * Ns], strides=[TP * Ns, 1], block_shape=[BK, BN])
    for tile in range(tl.program_id(0), TP * tiles_mt * tiles_n, tl.num_programs(0)):
        t = tile // (tiles_mt * tiles_n)
        local_m = (tile // tiles_n) % tiles_mt
        pid_m = m0 // BM + local_m
        pid_n = tile % tiles_n
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, tl.cdiv(dk, BK)):
            acc = tl.dot(k_desc.load([local_m * BM, k * BK]), w2_desc.load([k * BK, t * Ns + pid_n * BN]), acc,
                         input_precision=PRECISION)
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        mask = (offs_m < M)[:, None] & (offs_n < Ns)[None, :]
        buf = peer_buffer(peer_data_ptr, TP + t, part_offset, w2_ptr.dtype.element_ty)
        rel = (producer * M + offs_m).to(tl.int64)[:, None] * Ns + offs_n[None, :]
        tl.store(buf + rel, acc.to(w2_ptr.dtype.element_ty), mask=mask)
        if KEEP_LOCAL:
            own = peer_buffer(peer_data_ptr, rank, part_offset, w2_ptr.dtype.element_ty)
            tl.store(own + rel, acc.to(w2_ptr.dtype.element_ty), mask=mask)
        count_tile_done_to_ranks(counters_ptr + t * tiles_m + pid_m, peer_flags_ptr,
                                 tail_flag_word + producer * tiles_m + pid_m, tiles_n, epoch, TP + t, 1, 2 * TP)


@triton.jit
def stage1_kernel(
    a_ptr, w2_ptr, b2_ptr, out_ptr, peer_data_ptr, peer_flags_ptr, y_offset, a_flags_ptr, counters_ptr,
    epoch_ptr, ready_ptr, claim_ptr, report_ptr, timeout_ns,
    rank, M, Mp, Fp, Fship, F1, N, Ns, consumer, kchunk, nch, nch1, y_flag_word, part_ptr, tail_flags_ptr, tail_group,
    split_ptr, split_counters_ptr, split_k,
    WS: tl.constexpr, TP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    GROUP_M: tl.constexpr, HAS_B2: tl.constexpr, WAIT_READY: tl.constexpr, PRECISION: tl.constexpr,
    TIMED: tl.constexpr, INTERPRET: tl.constexpr, HAS_TAIL: tl.constexpr = False,
    SHIP_BEFORE_TAIL: tl.constexpr = False, SPLIT_K: tl.constexpr = False, READY_RUNS: tl.constexpr = False,
    SUM_PAIRS: tl.constexpr = False, SPLIT_FIXUP: tl.constexpr = False,
):
    """``Y[:, consumer*Ns + n] = A @ w2 (+ b2)`` into ``out`` [M, N] and every other rank's Y buffer.

    ``a_ptr``: this rank's buffer ``[TP * nch + nch1, Mp, kchunk]`` (chunk-major, see
    ``stage0_kernel``): the stage-0 ranks' chunks (A columns ``[0, TP * Fp)``), then ``nch1`` chunks
    of the last ``F1`` columns that this rank computed itself before this kernel (its share of
    the first GEMM, which balances the stages of a SwiGLU MLP); ``w2``: [TP * Fp + F1, Ns] row-major;
    ``b2``: [Ns] float32;
    ``a_flags_ptr``: flags per (group, producer, chunk); ``counters_ptr``: ``tiles_m`` local int32;
    Y buffers at byte ``y_offset`` of each data buffer, [M, N]; row block m of this consumer raises
    word ``y_flag_word + consumer * tiles_m + m`` of every other rank's flag buffer. Epoch and
    ``WAIT_READY`` (every other rank's): as in ``stage0_kernel``.

    Each stage-0 rank ships its ``Fp`` columns (W2 rows ``p * Fp + ...``), only the first ``Fship``
    of them for row group ``tail_group``. ``HAS_TAIL``: that group's rest came as partial products
    (``tail_kernel``), in ``part_ptr`` ``[TP, M, Ns]`` under ``tail_flags_ptr[p * tiles_m + m]``:
    the epilogue adds them. ``SHIP_BEFORE_TAIL`` (``TP == 1``): it first ships that group's rows
    without them (the stage-0 rank adds its own copy in its collect), then adds them into ``out``
    only, so the two transfers (partial products in, rows out) overlap instead of following
    each other.

    ``SPLIT_K`` (few tiles: decode sizes; ``split_k`` 1 without): each tile's K-chunks, in arrival
    order, are split into up to ``split_k`` contiguous runs, one work item each, so that all SMs
    stream W2; each run waits only for its own chunks. Its partial sum goes to its slot of
    ``split_ptr`` (``[tiles, split_k, BM, BN]`` float32), and the run that finishes last
    (``split_counters_ptr``: one local int32 per tile, 0 between calls) adds the slots in run
    order (the same bits whichever finishes last) and runs the tile's epilogue. ``SPLIT_FIXUP``: every run stores its
    slot and stops; ``stage1_split_sum_kernel``, launched after this kernel, adds the slots and runs the epilogues.
    """
    epoch = tl.load(epoch_ptr, volatile=True)
    if WAIT_READY:
        for q in range(1, WS):
            peer = (rank + q) % WS
            wait_flag(ready_ptr + peer, epoch, claim_ptr, report_ptr, OP_CTA_STAGE1, rank, peer + READY_FLAG_BASE, 1,
                      timeout_ns, TIMED)
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(Ns, BN)
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[(TP * nch + nch1) * Mp, kchunk], strides=[kchunk, 1],
                                       block_shape=[BM, BK])
    w2_desc = b_descriptor(w2_ptr, TP * Fp + F1, Ns, BK, BN, False)
    for item in range(tl.program_id(0), tiles_m * tiles_n * split_k, tl.num_programs(0)):
        tile = item // split_k
        split = item % split_k
        pid_m, pid_n = grouped_tile(tile, tiles_m, tiles_n, GROUP_M)
        in_tail_group, shipped, steps = _tile_chunks(pid_m, tail_group, Fp, Fship, kchunk, nch1, TP, GROUP_M)
        splits = tl.minimum(split_k, steps)
        if split < splits:
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            acc = _chunks_in_arrival_order(acc, a_desc, w2_desc, a_flags_ptr, epoch, claim_ptr, report_ptr, rank,
                                           timeout_ns, pid_m, pid_n, split * steps // splits,
                                           (split + 1) * steps // splits, shipped, Mp, Fp, F1, kchunk, nch, nch1, TP,
                                           BM, BN, BK, GROUP_M, PRECISION, TIMED, INTERPRET, READY_RUNS)
            finishes = True
            if SPLIT_K:
                acc, _, finishes = _split_run(acc, acc, split_ptr, split_counters_ptr, tile, split, splits, split_k,
                                              pid_m * BM + tl.arange(0, BM) < M, BM, BN, False, SUM_PAIRS, SPLIT_FIXUP)
            if finishes:
                _stage1_epilogue(acc, b2_ptr, out_ptr, peer_data_ptr, peer_flags_ptr, y_offset, counters_ptr, epoch,
                                 claim_ptr, report_ptr, timeout_ns, rank, M, N, Ns, consumer, y_flag_word, part_ptr,
                                 tail_flags_ptr, pid_m, pid_n, tiles_m, tiles_n, in_tail_group, pid_m * BM, WS, TP, BM,
                                 BN, HAS_B2, TIMED, HAS_TAIL, SHIP_BEFORE_TAIL)


@triton.jit
def _tile_chunks(pid_m, tail_group, Fp, Fship, kchunk, nch1, TP: tl.constexpr, GROUP_M: tl.constexpr):
    """(whether row block ``pid_m`` is in the tail group, the columns each stage-0 rank ships it, its K-chunks)."""
    in_tail_group = pid_m // GROUP_M == tail_group
    shipped = tl.where(in_tail_group, Fship, Fp)
    return in_tail_group, shipped, nch1 + TP * tl.cdiv(shipped, kchunk)


@triton.jit
def stage1_split_sum_kernel(
    split_ptr, b2_ptr, out_ptr, peer_data_ptr, peer_flags_ptr, y_offset, counters_ptr, epoch_ptr, claim_ptr,
    report_ptr, timeout_ns, rank, M, N, Ns, consumer, y_flag_word, part_ptr, tail_flags_ptr, tail_group, Fp, Fship,
    kchunk, nch1, split_k,
    WS: tl.constexpr, TP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr,
    ROWS: tl.constexpr, HAS_B2: tl.constexpr, TIMED: tl.constexpr, HAS_TAIL: tl.constexpr,
    SHIP_BEFORE_TAIL: tl.constexpr,
):
    """``stage1_kernel``'s split tiles finished after it (its ``SPLIT_FIXUP``): one program per ``ROWS`` rows of a
    tile adds those rows of the tile's runs' slots in run order (the bits of the in-kernel sum) and runs
    ``_stage1_epilogue`` on them; a row block's flag rises after all its tiles' pieces. Every SM takes part in the
    sums that the last run of each tile made alone in the kernel."""
    epoch = tl.load(epoch_ptr, volatile=True)
    pieces: tl.constexpr = BM // ROWS
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(Ns, BN)
    tile = tl.program_id(0) // pieces
    piece = tl.program_id(0) % pieces
    pid_m, pid_n = grouped_tile(tile, tiles_m, tiles_n, GROUP_M)
    in_tail_group, _, steps = _tile_chunks(pid_m, tail_group, Fp, Fship, kchunk, nch1, TP, GROUP_M)
    splits = tl.minimum(split_k, steps)
    row0 = pid_m * BM + piece * ROWS
    slots = _split_slots(split_ptr, tile, split_k, piece * ROWS, ROWS, BM, BN, False)
    acc, _ = _sum_slots(slots, splits, (row0 + tl.arange(0, ROWS) < M)[:, None], ROWS, BN, BM * BN, BM * BN, False)
    _stage1_epilogue(acc, b2_ptr, out_ptr, peer_data_ptr, peer_flags_ptr, y_offset, counters_ptr, epoch, claim_ptr,
                     report_ptr, timeout_ns, rank, M, N, Ns, consumer, y_flag_word, part_ptr, tail_flags_ptr, pid_m,
                     pid_n, tiles_m, tiles_n * pieces, in_tail_group, row0, WS, TP, ROWS, BN, HAS_B2, TIMED, HAS_TAIL,
                     SHIP_BEFORE_TAIL)


@triton.jit
def _chunks_in_arrival_order(acc, a_desc, w2_desc, a_flags_ptr, epoch, claim_ptr, report_ptr, rank, timeout_ns, pid_m,
                             pid_n, first, last, shipped, Mp, Fp, F1, kchunk, nch, nch1, TP: tl.constexpr,
                             BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                             PRECISION: tl.constexpr, TIMED: tl.constexpr, INTERPRET: tl.constexpr,
                             READY_RUNS: tl.constexpr):
    """``acc`` += the tile's K-chunks ``[first, last)`` in arrival order: this rank's own chunks
    (already here), then chunk j of every producer, then j + 1; each producer chunk's flag awaited
    just before it is read.

    ``READY_RUNS``: after a chunk's wait, the flags of the chunks after it are looked at once (no
    wait), and the run of chunks already here goes through one software-pipelined K-loop, which
    refills its pipeline once per run instead of once per chunk (a chunk is 28 BK-steps at 8
    GPUs' shapes, 56 at 4 GPUs'). A run ends after a chunk narrower than ``kchunk``."""
    if READY_RUNS:
        steps_per_chunk = kchunk // BK
        i = first
        while i < last:
            _wait_chunk(a_flags_ptr, epoch, claim_ptr, report_ptr, rank, timeout_ns, pid_m, i, nch, nch1, TP,
                        GROUP_M, TIMED)
            run_end = _ready_run_end(a_flags_ptr, epoch, pid_m, i, last, shipped, F1, kchunk, nch, nch1, TP, GROUP_M)
            fence_proxy_async(INTERPRET)
            steps = (run_end - 1 - i) * steps_per_chunk + _chunk_width(run_end - 1, shipped, F1, kchunk, nch1,
                                                                         TP) // BK
            chunk = i
            k = 0
            for _ in range(0, steps):  # (chunk, k) carried, not divided out of the step: no division per step
                block, k0 = _chunk_block(chunk, Fp, kchunk, nch, nch1, TP)
                acc = tl.dot(a_desc.load([block * Mp + pid_m * BM, k]), w2_desc.load([k0 + k, pid_n * BN]), acc,
                             input_precision=PRECISION)
                k += BK
                next_chunk = k == kchunk
                chunk = tl.where(next_chunk, chunk + 1, chunk)
                k = tl.where(next_chunk, 0, k)
            i = run_end
    else:
        for i in range(first, last):
            _wait_chunk(a_flags_ptr, epoch, claim_ptr, report_ptr, rank, timeout_ns, pid_m, i, nch, nch1, TP,
                        GROUP_M, TIMED)
            fence_proxy_async(INTERPRET)
            block, k0 = _chunk_block(i, Fp, kchunk, nch, nch1, TP)
            a_row = block * Mp + pid_m * BM
            for k in range(0, _chunk_width(i, shipped, F1, kchunk, nch1, TP), BK):
                acc = tl.dot(a_desc.load([a_row, k]), w2_desc.load([k0 + k, pid_n * BN]), acc,
                             input_precision=PRECISION)
    return acc


@triton.jit
def _chunk_flag(pid_m, i, nch, nch1, TP: tl.constexpr, GROUP_M: tl.constexpr):
    """The flag word of producer chunk ``i`` (in arrival order, ``i >= nch1``) of row block ``pid_m``."""
    return ((pid_m // GROUP_M) * TP + (i - nch1) % TP) * nch + (i - nch1) // TP


@triton.jit
def _wait_chunk(a_flags_ptr, epoch, claim_ptr, report_ptr, rank, timeout_ns, pid_m, i, nch, nch1, TP: tl.constexpr,
                GROUP_M: tl.constexpr, TIMED: tl.constexpr):
    """Wait for chunk ``i``'s flag; this rank's own chunks (``i < nch1``) are here already."""
    if i >= nch1:
        flag = _chunk_flag(pid_m, i, nch, nch1, TP, GROUP_M)
        wait_flag(a_flags_ptr + flag, epoch, claim_ptr, report_ptr, OP_CTA_STAGE1, rank, flag, nch, timeout_ns, TIMED)


@triton.jit
def _ready_run_end(a_flags_ptr, epoch, pid_m, i, last, shipped, F1, kchunk, nch, nch1, TP: tl.constexpr,
                   GROUP_M: tl.constexpr):
    """The end of the run that starts at chunk ``i`` (here): the first later chunk before ``last``
    not here yet, or the one after a chunk narrower than ``kchunk``."""
    run_end = i + 1
    open_run = _chunk_width(i, shipped, F1, kchunk, nch1, TP) == kchunk
    while open_run & (run_end < last):
        open_run = _chunk_here(a_flags_ptr, epoch, pid_m, run_end, nch, nch1, TP, GROUP_M)
        if open_run:
            open_run = _chunk_width(run_end, shipped, F1, kchunk, nch1, TP) == kchunk
            run_end += 1
    return run_end


@triton.jit
def _chunk_here(a_flags_ptr, epoch, pid_m, i, nch, nch1, TP: tl.constexpr, GROUP_M: tl.constexpr):
    """Whether chunk ``i`` is here now (one acquiring look at its flag, no wait)."""
    here = i < nch1
    if i >= nch1:
        flag = _chunk_flag(pid_m, i, nch, nch1, TP, GROUP_M)
        here = tl.atomic_add(a_flags_ptr + flag, 0, sem="acquire", scope="sys") >= epoch
    return here


@triton.jit
def _chunk_width(i, shipped, F1, kchunk, nch1, TP: tl.constexpr):
    """Columns of chunk ``i``: ``kchunk`` but for the last chunk of this rank's share or of a producer."""
    if i < nch1:
        width = tl.minimum(kchunk, F1 - i * kchunk)
    else:
        width = tl.minimum(kchunk, shipped - ((i - nch1) // TP) * kchunk)
    return width


@triton.jit
def _chunk_block(i, Fp, kchunk, nch, nch1, TP: tl.constexpr):
    """(block of the A buffer, W2 row of its first column) of chunk ``i`` in arrival order; selects
    rather than branches, so that the pipelined K-loop computes its load coordinates without one."""
    own = i < nch1
    p = (i - nch1) % TP
    j = (i - nch1) // TP
    return tl.where(own, TP * nch + i, p * nch + j), tl.where(own, TP * Fp + i * kchunk, p * Fp + j * kchunk)


@triton.jit
def _split_run(acc1, acc3, split_ptr, counters_ptr, tile, split, splits, split_k, row_ok, BM: tl.constexpr,
               BN: tl.constexpr, DUAL: tl.constexpr, SUM_PAIRS: tl.constexpr, SPLIT_FIXUP: tl.constexpr):
    """Run ``split`` of a split tile done: with ``SPLIT_FIXUP`` its sums stored in its slot (the fix-up kernel after
    the runs finishes the tile), else added to the other runs' (``_add_split_partials``: the last run finishes it).
    Returns (acc1, acc3, whether this run finishes the tile)."""
    if SPLIT_FIXUP:
        _store_run_slot(acc1, acc3, split_ptr, tile, split, split_k, row_ok, BM, BN, DUAL)
        finishes = False
    else:
        acc1, acc3, finishes = _add_split_partials(acc1, acc3, split_ptr, counters_ptr, tile, split, splits, split_k,
                                                   row_ok, BM, BN, DUAL, SUM_PAIRS)
    return acc1, acc3, finishes


@triton.jit
def _add_split_partials(acc, acc3, split_ptr, counters_ptr, tile, split, splits, split_k, row_ok, BM: tl.constexpr,
                        BN: tl.constexpr, DUAL: tl.constexpr, SUM_PAIRS: tl.constexpr = False):
    """(the tile's whole sums, True) for the run that finishes it last, (its own, False) for the
    others: ``acc`` (and ``acc3`` when DUAL) of run ``split`` of ``splits``, ``split_k`` slots
    per tile, one counter per tile. Every run stores its sums to its slot; the last to count adds
    the slots in run order, so the bits do not depend on which run finished last. (A fixed
    pairwise tree, which reads fewer slots per run but waits once per level, measured slower at
    8 of 10 decode shapes on an H100.) ``SUM_PAIRS`` (one accumulator): the slots read two at a time, both loads in
    flight before either is added (the same order of additions, so the same bits). Only rows below M are stored and
    read."""
    SLOT: tl.constexpr = BM * BN * (2 if DUAL else 1)
    slots = _split_slots(split_ptr, tile, split_k, 0, BM, BM, BN, DUAL)
    mask = row_ok[:, None]
    _store_split_slot(acc, acc3, slots + split * SLOT, mask, BM * BN, DUAL)
    finishes = count_local(counters_ptr + tile) == splits - 1
    if finishes:
        tl.atomic_xchg(counters_ptr + tile, 0, sem="relaxed", scope="gpu")  # for the next call
        tl.debug_barrier()  # every thread reads after the acquire above
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        acc3 = tl.zeros((BM, BN), dtype=tl.float32)
        first_single = 0
        if SUM_PAIRS and not DUAL:  # (DUAL's loop already has two tiles in flight)
            first_single = splits - splits % 2
            for q in range(0, first_single, 2):
                acc = _add_slot_pair(acc, slots + q * SLOT, mask, SLOT)
        for q in range(first_single, splits):
            # .cg: from L2, where the other SMs' stores went
            acc += tl.load(slots + q * SLOT, mask=mask, other=0.0, cache_modifier=".cg")
            if DUAL:
                acc3 += tl.load(slots + q * SLOT + BM * BN, mask=mask, other=0.0, cache_modifier=".cg")
    return acc, acc3, finishes


@triton.jit
def _split_slots(split_ptr, tile, split_k, row0, ROWS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                 DUAL: tl.constexpr):
    """Pointers to rows ``[row0, row0 + ROWS)`` of the first run's slot of ``tile`` (``split_k`` slots of
    ``(1 + DUAL) x BM x BN`` float32 a tile; run q's at ``q * SLOT`` further)."""
    SLOT: tl.constexpr = BM * BN * (2 if DUAL else 1)
    rows = row0 + tl.arange(0, ROWS)
    cols = tl.arange(0, BN)
    return split_ptr + (tile * split_k).to(tl.int64) * SLOT + (rows[:, None] * BN + cols[None, :])


@triton.jit
def _store_split_slot(acc, acc3, slot, mask, TILE: tl.constexpr, DUAL: tl.constexpr):
    """A run's sums into its slot (``slot``: ``_split_slots`` of its tile, moved to its run; rows below M: ``mask``)."""
    tl.store(slot, acc, mask=mask)
    if DUAL:
        tl.store(slot + TILE, acc3, mask=mask)


@triton.jit
def _store_run_slot(acc, acc3, split_ptr, tile, split, split_k, row_ok, BM: tl.constexpr, BN: tl.constexpr,
                    DUAL: tl.constexpr):
    """Run ``split``'s sums of ``tile`` into its slot, for a kernel after the runs to add (rows below M: ``row_ok``)."""
    SLOT: tl.constexpr = BM * BN * (2 if DUAL else 1)
    _store_split_slot(acc, acc3, _split_slots(split_ptr, tile, split_k, 0, BM, BM, BN, DUAL) + split * SLOT,
                      row_ok[:, None], BM * BN, DUAL)


@triton.jit
def _sum_slots(slots, splits, mask, ROWS: tl.constexpr, BN: tl.constexpr, SLOT: tl.constexpr, TILE: tl.constexpr,
               DUAL: tl.constexpr):
    """(the sums of ``splits`` runs' slots from ``slots``, rows ``mask``, in run order; the second accumulator's at
    ``TILE`` further, DUAL only) for a kernel after the runs: one accumulator's slots four at a time, then one by
    one (ptxas keeps about two loads of a thread in flight; several programs an SM)."""
    acc = tl.zeros((ROWS, BN), dtype=tl.float32)
    acc3 = tl.zeros((ROWS, BN), dtype=tl.float32)
    first_single = 0
    if not DUAL:
        first_single = splits - splits % 4
        for q in range(0, first_single, 4):
            acc = _add_slot_quad(acc, slots + q * SLOT, mask, SLOT)
    for q in range(first_single, splits):
        acc += tl.load(slots + q * SLOT, mask=mask, other=0.0)
        if DUAL:
            acc3 += tl.load(slots + q * SLOT + TILE, mask=mask, other=0.0)
    return acc, acc3


@triton.jit
def _add_slot_pair(acc, slot, mask, SLOT: tl.constexpr):
    """``acc`` + the slot at ``slot``, then + the next one: both slots loaded before either add (past L1: other SMs
    stored them during this kernel)."""
    first = tl.load(slot, mask=mask, other=0.0, cache_modifier=".cg")
    second = tl.load(slot + SLOT, mask=mask, other=0.0, cache_modifier=".cg")
    return acc + first + second


@triton.jit
def _add_slot_quad(acc, slot, mask, SLOT: tl.constexpr):
    """``acc`` + the slot at ``slot`` and the next three, in order, all four loaded before the first add."""
    first = tl.load(slot, mask=mask, other=0.0)
    second = tl.load(slot + SLOT, mask=mask, other=0.0)
    third = tl.load(slot + 2 * SLOT, mask=mask, other=0.0)
    fourth = tl.load(slot + 3 * SLOT, mask=mask, other=0.0)
    return acc + first + second + third + fourth


@triton.jit
def _stage1_epilogue(acc, b2_ptr, out_ptr, peer_data_ptr, peer_flags_ptr, y_offset, counters_ptr, epoch, claim_ptr,
                     report_ptr, timeout_ns, rank, M, N, Ns, consumer, y_flag_word, part_ptr, tail_flags_ptr, pid_m,
                     pid_n, tiles_m, pieces_in_block, in_tail_group, row0, WS: tl.constexpr, TP: tl.constexpr,
                     ROWS: tl.constexpr, BN: tl.constexpr, HAS_B2: tl.constexpr, TIMED: tl.constexpr,
                     HAS_TAIL: tl.constexpr, SHIP_BEFORE_TAIL: tl.constexpr):
    """A finished piece of stage-1 tile (pid_m, pid_n), its ``ROWS`` rows from ``row0`` (the whole tile, or a slice of
    it made by ``stage1_split_sum_kernel``): bias (and the tails), into ``out`` and every other rank's Y buffer, then
    counted towards its row block's flag on every other rank, which rises after ``pieces_in_block`` pieces."""
    offs_m = row0 + tl.arange(0, ROWS)
    offs_n = pid_n * BN + tl.arange(0, BN)
    acc = add_bias(acc, b2_ptr, offs_n, Ns, HAS_B2)
    row_ok = offs_m < M
    cols = consumer * Ns + offs_n
    mask = row_ok[:, None] & (offs_n < Ns)[None, :]
    ptrs = offs_m.to(tl.int64)[:, None] * N + cols[None, :]
    tails_later = False
    if HAS_TAIL:
        if in_tail_group:
            if SHIP_BEFORE_TAIL:
                tails_later = True
            else:
                acc = _add_tails(acc, part_ptr, tail_flags_ptr, offs_m, offs_n, M, Ns, tiles_m, pid_m, epoch,
                                 claim_ptr, report_ptr, rank, timeout_ns, TP, TIMED)
    if not tails_later:
        tl.store(out_ptr + ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    for q in range(1, WS):
        peer = (rank + q) % WS
        buf = peer_buffer(peer_data_ptr, peer, y_offset, out_ptr.dtype.element_ty)
        tl.store(buf + ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    count_tile_done_to_ranks(counters_ptr + pid_m, peer_flags_ptr, y_flag_word + consumer * tiles_m + pid_m,
                             pieces_in_block, epoch, rank + 1, WS - 1, WS)
    if tails_later:
        # Rounded as shipped first: the stage-0 rank adds the same partial products to the same
        # rounded rows, so every rank returns the same bits (as an all-reduce does).
        acc = acc.to(out_ptr.dtype.element_ty).to(tl.float32)
        acc = _add_tails(acc, part_ptr, tail_flags_ptr, offs_m, offs_n, M, Ns, tiles_m, pid_m, epoch,
                         claim_ptr, report_ptr, rank, timeout_ns, TP, TIMED)
        tl.store(out_ptr + ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _add_tails(acc, part_ptr, tail_flags_ptr, offs_m, offs_n, M, Ns, tiles_m, pid_m, epoch, claim_ptr, report_ptr,
               rank, timeout_ns, TP: tl.constexpr, TIMED: tl.constexpr):
    """``acc`` plus every stage-0 rank's tail partial products for this tile, each once its flag is up."""
    tail_mask = (offs_m < M)[:, None] & (offs_n < Ns)[None, :]
    for p in range(TP):
        wait_flag(tail_flags_ptr + p * tiles_m + pid_m, epoch, claim_ptr, report_ptr, OP_CTA_TAIL, rank,
                  p * tiles_m + pid_m, tiles_m, timeout_ns, TIMED)
        part = tl.load(part_ptr + (p * M + offs_m).to(tl.int64)[:, None] * Ns + offs_n[None, :], mask=tail_mask,
                       other=0.0)
        acc += part.to(tl.float32)
    return acc


@triton.jit
def collect_kernel(y_ptr, out_ptr, y_flags_ptr, epoch_ptr, claim_ptr, report_ptr, timeout_ns,
                   rank, M, N, Ns, tiles_m, skip, col_blocks, cols_per_block, part_ptr, m0,
                   BM: tl.constexpr, BC: tl.constexpr, TIMED: tl.constexpr, ADD_TAIL: tl.constexpr = False):
    """One program per (consumer t, row block m, column block): wait for Y flag (t, m), copy
    ``Y[m rows, t*Ns + column block]`` into ``out``. Consumer ``skip`` (this rank's own) is skipped.
    ``cols_per_block`` is a multiple of BC and N, Ns of 16 bytes: every access is a full vector.
    ``ADD_TAIL`` (one stage-1 rank): rows from ``m0`` came without this rank's tail partial products,
    ``part_ptr`` ``[M, N]`` (its own copy, ``tail_kernel``'s ``KEEP_LOCAL``): added here."""
    epoch = tl.load(epoch_ptr, volatile=True)
    pid = tl.program_id(0)
    cb = pid % col_blocks
    m = (pid // col_blocks) % tiles_m
    t = pid // (col_blocks * tiles_m)
    if t != skip:
        flag = t * tiles_m + m
        wait_flag(y_flags_ptr + flag, epoch, claim_ptr, report_ptr, OP_CTA_COLLECT, rank, flag, tiles_m, timeout_ns,
                  TIMED)
        offs_m = m * BM + tl.arange(0, BM)
        row_base = offs_m.to(tl.int64)[:, None] * N + t * Ns
        for c in range(0, cols_per_block, BC):
            offs_c = cb * cols_per_block + c + tl.arange(0, BC)
            mask = (offs_m < M)[:, None] & (offs_c < Ns)[None, :]
            ptrs = row_base + offs_c[None, :]
            rows = tl.load(y_ptr + ptrs, mask=mask)
            if ADD_TAIL:
                if m * BM >= m0:
                    rows = (rows.to(tl.float32) + tl.load(part_ptr + ptrs, mask=mask).to(tl.float32)).to(rows.dtype)
            tl.store(out_ptr + ptrs, rows, mask=mask)


@triton.jit
def begin_kernel(epoch_ptr, peer_flags_ptr, ready_word, rank, WS: tl.constexpr):
    """A call inside a captured graph: ``epoch += 1`` in device memory (a replay must not reuse the
    epoch it was captured with), then ``READY[rank] = epoch`` in every peer's flags."""
    epoch = tl.load(epoch_ptr, volatile=True) + 1
    tl.store(epoch_ptr, epoch)
    for q in range(1, WS):
        flags = tl.load(peer_flags_ptr + (rank + q) % WS).to(tl.pointer_type(tl.int32))
        signal_flag(flags + ready_word + rank, epoch)


# ------------------------------------------------------------------------------------ launchers
def padded_rows(M: int, BM: int) -> int:
    return launcher.cdiv(M, BM) * BM


def launch_stage0(x, w1, b1, w3, b3, stage, peer_data, peer_flags, counters, done, epoch, producer, kchunk, nch,
                  a_flag_word, first_consumer, tp, act, config, num_sms, ready=None, status=None, timeout_ns=0,
                  rank=0, timed=True, count_first_at_once=False, fship=None, keep=None, tail_group=0,
                  tma_store=False, split_last=False, split_k=1, split_partials=None, split_counters=None, form=None,
                  stream_k_tail=False):
    """``stage``: the local ``[nch, Mp, kchunk]`` block (copy-engine transport) or None (stores go
    straight into the consumers' buffers); ``epoch``: a device int32 word; ``ready``: the READY
    words to wait on in the kernel (None: the caller made the stream wait); ``fship``: columns
    row group ``tail_group`` ships (default all), the rest of that group's into ``keep``
    ``[Mp - m0, Fp - fship]`` (the tail; ``m0``: the group's first row); ``tma_store``: the
    staged tiles by TMA (with ``stage`` only); ``split_last``: a final partial round of tail tiles
    made in half-width tiles (``split_tail_tiles``; not with split-K); ``split_k`` > 1: each tile's
    K-steps in that many runs (``stage0_kernel``'s ``SPLIT_K``), with ``split_partials`` (float32,
    ``split_partials_numel`` with two accumulators for SwiGLU) and ``split_counters`` (int32, one
    per tile, 0). Where ``stage0_sums_after_runs``: the runs only store their sums, and ``stage0_split_sum_kernel``,
    launched after, adds them and makes the tiles' epilogues, ``knobs.cta.STAGE0_FIXUP_ROWS`` rows a program.
    ``form``: a warp-specialized Gluon form (``codegen/cta_ws.py``; ``stage0_form`` says where one applies) on
    ``config``'s row blocks, K-steps and row groups. ``stream_k_tail`` (an unsplit call, ``split_partials`` of
    ``stage0_partials_numel``): the tiles of the last, partial round stream-K where ``knobs.cta.STAGE0_STREAM_K_TAIL``
    (``stage0_partial_slots``), summed by ``stage0_split_sum_kernel``."""
    M, H = x.shape
    Fp = w1.shape[1]
    BM, BN, BK, GROUP_M, stages, warps = config
    if form is not None:  # (Hopper; imported only where it runs)
        from . import cta_ws

        cta_ws.launch(x, w1, b1, stage, keep, counters, done, epoch, kchunk, nch, tp, first_consumer, act, form, config,
                      num_sms, padded_rows(M, BM), Fp if fship is None else fship, tail_group, ready=ready,
                      status=status, timeout_ns=timeout_ns, rank=rank, timed=timed,
                      count_first_at_once=count_first_at_once, tma_store=tma_store, split_k=split_k)
        return
    assert kchunk % BN == 0, (kchunk, BN)
    assert w1.stride(1) == 1 and (w3 is None or w3.stride() == w1.stride()), (w1.stride(), w3 and w3.stride())
    fship = Fp if fship is None else fship
    assert fship == Fp or (fship % BN == 0 and keep is not None), (fship, Fp, BN)
    tiles = launcher.cdiv(M, BM) * launcher.cdiv(Fp, BN)
    fixup = stage0_sums_after_runs(M, split_k)
    stream_k = stage0_streams_k(M, split_k)
    sk_tiles, holders, slots = stage0_partial_slots(M, H, Fp, config, split_k, num_sms, stream_k_tail)
    sk_tiles = 0 if stream_k else sk_tiles  # (the last round's stream-K tiles; split stream-K takes every tile)
    # (half-width last tiles only without split-K or a stream-K tail: those already fill the SMs)
    split = (split_tail_tiles(M, Fp, fship, BM, BN, GROUP_M, tail_group, num_sms)
             if split_last and split_k == 1 and not sk_tiles else 0)
    if split_k > 1 or sk_tiles:
        assert split_k <= launcher.cdiv(H, BK), (split_k, H, BK)
        accumulators = 2 if act == ACT_SWIGLU else 1
        _check_split_buffers(split_partials, split_counters if split_k > 1 else counters,
                             holders * slots * accumulators * BM * BN, tiles)
    after = fixup or sk_tiles > 0  # the fix-up kernel sums slots after this one
    rows = min(BM, knobs.cta.STAGE0_FIXUP_ROWS)
    grid = (num_sms,) if stream_k or sk_tiles else (max(1, min(num_sms, tiles * split_k)),)
    launcher.launch(stage0_kernel, grid,
        x, w1, b1 if b1 is not None else w1, w3 if w3 is not None else w1, b3 if b3 is not None else w1,
        stage if stage is not None else x, peer_data, peer_flags, counters, done,
        epoch, ready if ready is not None else counters, *(status or (counters, counters)), timeout_ns, rank,
        M, padded_rows(M, BM), H, Fp, w1.stride(0), fship, keep if keep is not None else x, tail_group, producer,
        kchunk, nch,
        a_flag_word, first_consumer,
        TP=tp, BM=BM, BN=BN, BK=BK, GROUP_M=GROUP_M, ACT=act, HAS_B1=b1 is not None, HAS_B3=b3 is not None,
        STAGED=stage is not None, WAIT_READY=ready is not None,
        PRECISION="ieee" if x.dtype == torch.float32 else None, TIMED=timed,
        COUNT_FIRST_AT_ONCE=count_first_at_once, TMA_STORE=tma_store and stage is not None,
        INTERPRET=launcher.interpreting(),
        split_tiles=split, SPLIT_LAST=split > 0,
        split_ptr=split_partials if split_k > 1 or sk_tiles else counters,
        split_counters_ptr=split_counters if split_k > 1 else counters, split_k=split_k, SPLIT_K=split_k > 1,
        SUM_PAIRS=knobs.cta.SPLIT_SUM_PAIRS, SPLIT_FIXUP=fixup, STREAM_K=stream_k or sk_tiles > 0,
        sk_tiles=sk_tiles, sk_slots=slots, units=BM // rows if sk_tiles else 1, num_stages=stages, num_warps=warps,
    )
    if after:
        summed = sk_tiles if sk_tiles else tiles
        launcher.launch(stage0_split_sum_kernel, (summed * (BM // rows),),
            split_partials, x, b1 if b1 is not None else w1, b3 if b3 is not None else w1,
            stage if stage is not None else x, peer_data, peer_flags, counters, done, keep if keep is not None else x,
            epoch, M, padded_rows(M, BM), Fp, fship, tail_group, producer, kchunk, nch, a_flag_word, first_consumer,
            slots, launcher.cdiv(H, BK), grid[0], tiles - summed,
            TP=tp, BM=BM, BN=BN, GROUP_M=GROUP_M, ROWS=rows, ACT=act, HAS_B1=b1 is not None, HAS_B3=b3 is not None,
            STAGED=stage is not None, STREAM_K=stream_k or sk_tiles > 0, num_warps=4,
        )


def stage0_form(form: str | None, x: torch.Tensor, Fp: int, act: int, staged: bool, tma_store: bool, split_k: int,
                kchunk: int, fship: int, block_m: int) -> str | None:
    """``form`` (a Gluon form of ``codegen/cta_ws.py``, or None) where it runs this stage-0 call
    (``cta_ws.unsupported``), else None: the Triton kernel."""
    from . import cta_ws

    if form is not None and form not in cta_ws.FORMS:
        raise ValueError(f"CTA stage 0's form {form!r}: one of {', '.join(map(repr, cta_ws.FORMS))} or None")
    if form is None or launcher.interpreting() or not x.is_cuda:
        return None
    return None if cta_ws.unsupported(form, x, Fp, act, staged, tma_store, split_k, kchunk, fship, block_m) else form


def split_tail_tiles(M: int, Fp: int, fship: int, BM: int, BN: int, GROUP_M: int, tail_group: int,
                     num_sms: int) -> int:
    """How many of stage 0's last tiles to make in half-width tiles (0: none): the final, partial
    round's, when it is at most half a round (so the halves fit in one round) and every one of
    them is a tail tile (kept, never counted: the last tiles in ``grouped_tile`` order are the
    last group's last columns, and only ``tail_group``, the last group, has a tail). Rounds of
    ``num_sms`` programs, the persistent grid of ``launch_stage0`` when there are more tiles."""
    tiles_m, tiles_n = -(-M // BM), -(-Fp // BN)
    total = tiles_m * tiles_n
    last = total % num_sms if total > num_sms else 0
    groups = -(-tiles_m // GROUP_M)
    if not last or 2 * last > num_sms or BN % 32 or fship >= Fp or tail_group != groups - 1:
        return 0
    rows_last = tiles_m - (groups - 1) * GROUP_M
    return last if last <= rows_last * (tiles_n - fship // BN) else 0


def _sums_after_runs(M: int, split_k: int, on: bool, call_rows: tuple[int, int]) -> bool:
    """A split call of ``M`` rows has its tiles summed by a kernel after the runs: the knob ``on`` and ``M`` within
    ``call_rows`` (both ends in)."""
    return split_k > 1 and on and call_rows[0] <= M <= call_rows[1]


def stage0_sums_after_runs(M: int, split_k: int) -> bool:
    """Whether a stage-0 call of ``M`` rows in ``split_k`` runs a tile has its split tiles summed by
    ``stage0_split_sum_kernel`` after the runs (``knobs.cta.STAGE0_SPLIT_FIXUP``, ``STAGE0_FIXUP_CALL_ROWS``)."""
    return _sums_after_runs(M, split_k, knobs.cta.STAGE0_SPLIT_FIXUP, knobs.cta.STAGE0_FIXUP_CALL_ROWS)


def stage0_streams_k(M: int, split_k: int) -> bool:
    """Whether a split stage-0 call of ``M`` rows runs stream-K (``knobs.cta.STAGE0_STREAM_K``): only where its split
    tiles are summed after the runs."""
    return knobs.cta.STAGE0_STREAM_K and stage0_sums_after_runs(M, split_k)


def stage0_partial_slots(M: int, H: int, Fp: int, config, split_k: int, num_sms: int,
                         tail: bool = False) -> tuple[int, int, int]:
    """(the tiles a stage-0 call makes stream-K, the tiles that have partial-sum slots, the slots a tile has).

    Stream-K: every tile where its split runs are (``stage0_streams_k``); with ``tail`` (its caller gives it the
    buffer) and ``knobs.cta.STAGE0_STREAM_K_TAIL``, an unsplit call's last, partial round of tiles (every tile where
    they are fewer than the SMs). A stream-K tile has at most as many slots as programs whose shares of the stream-K
    tiles' K-steps meet it (each share holds at least ``total // num_sms``); a split one its ``split_k`` runs."""
    tiles = launcher.cdiv(M, config[0]) * launcher.cdiv(Fp, config[1])
    if split_k > 1:
        sk_tiles = tiles if stage0_streams_k(M, split_k) else 0
    else:
        sk_tiles = tiles % num_sms if tail and knobs.cta.STAGE0_STREAM_K_TAIL else 0
    if not sk_tiles:
        return 0, tiles if split_k > 1 else 0, split_k
    steps = launcher.cdiv(H, config[2])
    share = sk_tiles * steps // num_sms
    return sk_tiles, sk_tiles, steps if share == 0 else min(steps, launcher.cdiv(steps, share) + 1)


def stage0_partials_numel(M: int, H: int, Fp: int, config, split_k: int, num_sms: int, accumulators: int = 1,
                          tail: bool = False) -> int:
    """Float32 elements of a stage-0 call's partial sums (its split or stream-K tiles' slots; 0: none)."""
    _, holders, slots = stage0_partial_slots(M, H, Fp, config, split_k, num_sms, tail)
    return holders * slots * accumulators * config[0] * config[1]


def stage1_sums_after_runs(M: int, split_k: int) -> bool:
    """Whether a stage-1 call of ``M`` rows in ``split_k`` runs a tile has its split tiles summed by
    ``stage1_split_sum_kernel`` after the runs (``knobs.cta.STAGE1_SPLIT_FIXUP``, ``STAGE1_FIXUP_CALL_ROWS``)."""
    return _sums_after_runs(M, split_k, knobs.cta.STAGE1_SPLIT_FIXUP, knobs.cta.STAGE1_FIXUP_CALL_ROWS)


def launch_stage1(a, w2, b2, out, peer_data, peer_flags, y_offset, a_flags, counters, epoch, status, timeout_ns,
                  rank, ws, M, Fp, consumer, kchunk, nch, y_flag_word, tp, config, num_sms, timed=True, f1=0,
                  ready=None, fship=None, part=None, tail_flags=None, tail_group=0, ship_before_tail=False,
                  split_k=1, split_partials=None, split_counters=None):
    """``a``: this rank's buffer, ``[(tp * nch + cdiv(f1, kchunk)) * Mp, kchunk]``; ``fship``: columns
    each stage-0 rank ships for row group ``tail_group`` (default ``Fp``; ``Fp`` for the others);
    ``part`` / ``tail_flags``: that group's tails' partial products ``[tp, M, Ns]`` and their flags
    (``tail_kernel``), None without tails; ``ship_before_tail`` (``tp == 1``): that group's rows go
    out before the tails are added (``stage1_kernel``'s ``SHIP_BEFORE_TAIL``). ``split_k`` > 1: each
    tile's K-chunks in up to that many runs (``stage1_kernel``'s ``SPLIT_K``), with
    ``split_partials`` (float32, ``split_partials_numel``) and ``split_counters`` (int32, one per
    tile, 0). Where ``stage1_sums_after_runs``: the runs only store their sums, and ``stage1_split_sum_kernel``,
    launched after, adds them and makes the tiles' epilogues, ``knobs.cta.STAGE1_FIXUP_ROWS`` rows a program."""
    assert not ship_before_tail or (tp == 1 and part is not None), (tp, ship_before_tail)
    Ns = w2.shape[1]
    N = out.shape[1]
    BM, BN, BK, GROUP_M, stages, warps = config
    fship = Fp if fship is None else fship
    assert kchunk % BK == 0 and Fp % BK == 0 and fship % BK == 0 and f1 % BK == 0, (kchunk, Fp, fship, f1, BK)
    tiles = launcher.cdiv(M, BM) * launcher.cdiv(Ns, BN)
    if split_k > 1:
        _check_split_buffers(split_partials, split_counters, split_partials_numel(M, Ns, config, split_k), tiles)
    fixup = stage1_sums_after_runs(M, split_k)
    grid = (max(1, min(num_sms, tiles * split_k)),)
    launcher.launch(stage1_kernel, grid,
        a, w2, b2 if b2 is not None else out, out, peer_data, peer_flags, y_offset, a_flags, counters,
        epoch, ready if ready is not None else counters, *status, timeout_ns,
        rank, M, padded_rows(M, BM), Fp, fship, f1, N, Ns, consumer, kchunk, nch, launcher.cdiv(f1, kchunk), y_flag_word,
        part if part is not None else out, tail_flags if tail_flags is not None else counters, tail_group,
        split_partials if split_k > 1 else counters, split_counters if split_k > 1 else counters, split_k,
        WS=ws, TP=tp, BM=BM, BN=BN, BK=BK, GROUP_M=GROUP_M, HAS_B2=b2 is not None, WAIT_READY=ready is not None,
        PRECISION="ieee" if a.dtype == torch.float32 else None, TIMED=timed, INTERPRET=launcher.interpreting(),
        HAS_TAIL=part is not None, SHIP_BEFORE_TAIL=ship_before_tail, SPLIT_K=split_k > 1,
        READY_RUNS=knobs.cta.STAGE1_READY_RUNS, SUM_PAIRS=knobs.cta.SPLIT_SUM_PAIRS, SPLIT_FIXUP=fixup,
        num_stages=stages, num_warps=warps,
    )
    if fixup:
        rows = min(BM, knobs.cta.STAGE1_FIXUP_ROWS)
        launcher.launch(stage1_split_sum_kernel, (tiles * (BM // rows),),
            split_partials, b2 if b2 is not None else out, out, peer_data, peer_flags, y_offset, counters, epoch,
            *status, timeout_ns, rank, M, N, Ns, consumer, y_flag_word, part if part is not None else out,
            tail_flags if tail_flags is not None else counters, tail_group, Fp, fship, kchunk,
            launcher.cdiv(f1, kchunk), split_k,
            WS=ws, TP=tp, BM=BM, BN=BN, GROUP_M=GROUP_M, ROWS=rows, HAS_B2=b2 is not None, TIMED=timed,
            HAS_TAIL=part is not None, SHIP_BEFORE_TAIL=ship_before_tail, num_warps=4,
        )


def split_partials_numel(M: int, N: int, config, split_k: int, accumulators: int = 1) -> int:
    """Float32 elements of a stage's split-K partial sums (``N``: its columns): a slot of
    ``accumulators`` ``BM x BN`` tiles per tile and run."""
    BM, BN = config[0], config[1]
    return launcher.cdiv(M, BM) * launcher.cdiv(N, BN) * split_k * accumulators * BM * BN


def _check_split_buffers(partials, counters, numel: int, words: int) -> None:
    """Split-K's buffers: ``numel`` float32 partials, ``words`` counters (a tensor, or a device
    pointer into the flag region, which the plan sized)."""
    assert partials is not None and partials.dtype == torch.float32, "split-K needs float32 partial sums"
    assert partials.numel() >= numel, (partials.numel(), numel)
    assert counters is not None, "split-K needs its counters"
    assert not isinstance(counters, torch.Tensor) or counters.numel() >= words, (counters.numel(), words)


def launch_tail(keep, w2, peer_data, peer_flags, part_offset, counters, epoch, status, timeout_ns, rank, M, producer,
                tail_flag_word, tp, config, num_sms, ready=None, timed=True, m0=0, keep_local=False):
    """``keep``: ``[Mp - m0, dk]`` (this stage-0 rank's tail of A, rows from ``m0``, a whole number of
    row blocks); ``w2``: its rows, ``[dk, N]``; ``keep_local`` (``tp == 1``): the partial products
    also into this rank's own buffer at ``part_offset`` (for ``launch_collect``'s ``part``)."""
    assert not keep_local or tp == 1, tp
    dk, N = w2.shape
    Ns = N // tp
    BM, BN, BK, _, stages, warps = config
    assert m0 % BM == 0 and 0 <= m0 < M, (m0, M, BM)
    grid = (max(1, min(num_sms, tp * launcher.cdiv(M - m0, BM) * launcher.cdiv(Ns, BN))),)
    launcher.launch(tail_kernel, grid,
        keep, w2, peer_data, peer_flags, part_offset, counters, epoch, ready if ready is not None else counters,
        *status, timeout_ns, rank, M, m0, dk, Ns, producer, tail_flag_word,
        TP=tp, BM=BM, BN=BN, BK=BK, WAIT_READY=ready is not None,
        PRECISION="ieee" if keep.dtype == torch.float32 else None, TIMED=timed, KEEP_LOCAL=keep_local,
        num_stages=stages, num_warps=warps,
    )


def launch_begin(epoch, peer_flags, ready_word, rank, ws):
    launcher.launch(begin_kernel, (1,), epoch, peer_flags, ready_word, rank, WS=ws, num_warps=1)


def launch_collect(y, out, y_flags, epoch, status, timeout_ns, rank, tp, skip, BM, timed=True, col_blocks=8,
                   part=None, m0=0):
    """``part``: this rank's own tail partial products ``[M, N]`` (``tp == 1``), added to rows from
    ``m0`` (a whole number of BM blocks), which stage 1 shipped without them."""
    M, N = out.shape
    assert part is None or (tp == 1 and m0 % BM == 0), (tp, m0, BM)
    Ns = N // tp
    tiles_m = launcher.cdiv(M, BM)
    bc = 64 if y.element_size() >= 4 else 128
    col_blocks = max(1, min(col_blocks, launcher.cdiv(Ns, bc)))
    cols_per_block = launcher.cdiv(launcher.cdiv(Ns, col_blocks), bc) * bc
    grid = (tp * tiles_m * col_blocks,)
    launcher.launch(collect_kernel, grid, y, out, y_flags, epoch, *status, timeout_ns, rank, M, N, Ns, tiles_m, skip,
                    col_blocks, cols_per_block, part if part is not None else out, m0, BM=BM, BC=bc, TIMED=timed,
                    ADD_TAIL=part is not None, num_warps=4)
