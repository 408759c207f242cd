"""``mm_rs`` / ``mm_ar`` producer: a persistent GEMM that computes the chunks other ranks own first
and its own chunk last, reducing the partials that arrived meanwhile in its own tiles' epilogue.

Tile order, per round (``mm_rs`` has one round; ``mm_ar`` splits M into rounds so that the
all-gather of round t overlaps the GEMM of round t+1): chunk rank+1, rank+2, ..., then rank.

Chunks travel in *bands* of ``band_rows`` rows (a multiple of every block height, the same on
every rank); flags and counters are per (round, chunk, band): index ``(round * ws + c) * nbands + b``.

- A remote chunk c: each tile (with bias) goes to ``stage[round, c]`` in the output dtype; the CTA
  that finishes a band raises ``done[round, c, band]`` (release). The copy engine waits for that
  flag, copies the band into rank c's ``recv[round, rank]`` and raises rank c's
  ``recv_flags[round, rank, band]``: the transfer of a chunk starts with its first band.
- The own chunk: each tile waits for ``recv_flags[round, p, band]`` of every peer p (bounded,
  acquire), adds those partials to its accumulator in float32 and stores the sum into ``out``. With
  ``WRITE_GATHER`` (``mm_ar``) it also stores into ``gather[round, rank]`` and counts the tile, so
  that the copy engine pushes each reduced band to every peer as soon as it is complete.

``TMA`` (the copy-engine transport, contiguous chunks whose rows BM divides; ``mm_ar``'s rounds too, without
``COPY_OUT``): remote tiles go to ``stage`` by TMA stores, and a CTA counts its staged tiles of one band together,
after the main loop of its next tile of another band or of its own chunk (so before any wait; the bulk stores
drained meanwhile), and at the end; the own tiles load the peers' partials by TMA and store into ``out`` by TMA
(``mm_ar``'s copy into ``gather`` stays a pointer store, counted at once). Otherwise pointer stores, each tile
counted right after them. ``SUBTILE`` (with ``TMA``): the
staged and own tiles are stored in two column halves, the own tile's epilogue run on each half in turn.

``ws_pingpong`` / ``ws_pingpong_direct`` / ``ws_coop`` run ``codegen/mm_rs_ws.py``'s Gluon kernel instead (where
``TMA`` applies): a loader warp that draws the tickets and two MMA warpgroups taking tiles in turns, one's epilogue
under the other's main loop, or sharing each 128 x 256 tile.

``PEER_STORE`` ships with the SMs instead of the copy engine: a remote tile is stored straight into
its owner's receive buffer (after waiting, once per CTA, for the owner's ``READY``), and the last
tile of a band raises the owner's flag itself (system-scope release); with ``WRITE_GATHER`` the
reduced tiles go into every peer's gather buffer the same way. No staging, no host-issued copies.

``COPY_OUT`` (``mm_ar``): the peers' reduced bands, once in this rank's gather region (their flags
raised), are copied into ``out`` by copy tiles of this kernel, round t's after round t+1's GEMM tiles,
instead of by the host's copies: a copy within one GPU runs on the SMs, so those waited for the
kernel's last tile (bench/probe_copy_sms.py).

Chunks shorter than a tile (decode sizes; ``span_chunks``): a tile covers BM / rows consecutive chunks, so that a
128-row tile computes two 64-row chunks instead of one and 64 rows it throws away; the groups of chunks come in
the order above, the one holding the own chunk last, whose tiles stage and count their remote chunks first and then
sum the own chunk's rows with the peers' partials (``_span_tile``).

Tiles are handed out in that order by an atomic counter (not by CTA index): a CTA that is not
resident (SMs busy with other work) then holds no tile that a peer's spinning CTA depends on, so
waits across GPUs cannot form a cycle. The CTA that draws the last ticket resets the counter.

Rows: local row i of chunk c of round t is A row ``t * ws * rows + global_row(i, c, run, ws)``;
the own chunk's row i goes to ``out`` row ``t * out_round_stride + out_offset + i`` (< out_rows).
"""

import torch
import triton
import triton.language as tl

from ..spec import knobs
from . import launcher
from .configs import GLUON_STORES, store_variant
from .epilogue import epilogue_fn
from .flags import (GATHER_FLAG_BASE, OP_MM_AR, OP_MM_RS, READY_FLAG_BASE, count_bulk_stored, count_tile_done,
                    count_tile_done_to_peers, fence_proxy_async, wait_flag)
from .tiles import (add_bias, b_descriptor, column_halves, global_row, grouped_tile, load_rows, mainloop,
                    peer_buffer, store_rows)


@triton.jit(do_not_specialize=["epoch"])  # per-call values: see launcher.py
def mm_rs_kernel(
    a_ptr, b_ptr, bias_ptr, stage_ptr, recv_ptr, gather_ptr, out_ptr,
    counters_ptr, done_ptr, recv_flags_ptr, tile_ticket_ptr, gathered_ptr, epoch, claim_ptr, report_ptr, timeout_ns,
    rank, M, N, K, rows, run, rounds, out_round_stride, out_offset, out_rows, band_rows, nbands,
    peer_data_ptr, peer_flags_ptr, ready_ptr, gather_offset, rs_flag_word, ag_flag_word, ep0, ep1, ep2, ep3,
    EPILOGUE: tl.constexpr, WS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    B_KMAJOR: tl.constexpr, HAS_BIAS: tl.constexpr, AVERAGE: tl.constexpr, WRITE_GATHER: tl.constexpr,
    PRECISION: tl.constexpr, TIMED: tl.constexpr, PEER_STORE: tl.constexpr, TMA: tl.constexpr = False,
    INTERPRET: tl.constexpr = False, COPY_OUT: tl.constexpr = False, SUBTILE: tl.constexpr = False,
    PARTIAL_STAGES: tl.constexpr = 1, SPAN: tl.constexpr = 1,
):
    OP: tl.constexpr = OP_MM_AR if WRITE_GATHER else OP_MM_RS
    tiles_per_chunk = tl.cdiv(rows, BM) * tl.cdiv(N, BN)
    # SPAN > 1: each tile covers SPAN consecutive chunks (see _span_tile)
    gemm_per_round = WS * tiles_per_chunk if SPAN == 1 else WS // SPAN * tl.cdiv(N, BN)
    # COPY_OUT (mm_ar): the peers' reduced chunks, once in this rank's gather region, are copied into
    # ``out`` by copy tiles of this kernel, round t's after round t+1's GEMM tiles (see _copy_out_order)
    copy_per_round = (WS - 1) * tiles_per_chunk if COPY_OUT else 0
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = b_descriptor(b_ptr, K, N, BK, BN, B_KMAJOR)
    if TMA:  # contiguous chunks, BM divides them (launch): tiles never straddle two
        # SUBTILE: tiles stored in two column halves (the epilogue of the second overlaps the first's store)
        stage_desc = tl.make_tensor_descriptor(stage_ptr, shape=[rounds * WS * rows, N], strides=[N, 1],
                                               block_shape=[BM, BN // 2 if SUBTILE else BN])
        recv_desc = tl.make_tensor_descriptor(recv_ptr, shape=[rounds * WS * rows, N], strides=[N, 1],
                                              block_shape=[BM, BN])
        out_desc = tl.make_tensor_descriptor(out_ptr, shape=[out_rows, N], strides=[N, 1],
                                             block_shape=[BM, BN // 2 if SUBTILE else BN])
    else:  # stand-ins for _rs_tile's arguments, never used without TMA
        stage_desc = a_desc
        recv_desc = a_desc
        out_desc = a_desc
    # TMA: staged remote tiles are counted later, several of one band at once: after the main loop of
    # the CTA's next tile of another band (or of its own chunk, before its waits), and at the end
    pending = -1  # TMA: the band (slot * nbands + band) of the uncounted staged tiles
    pending_n = 0  # how many of its tiles
    pending_tiles = 0  # tiles in that band
    waited = -1  # this CTA has seen every peer's partial of (round, band) keys <= waited
    ready_seen = 0  # PEER_STORE: bit p set once rank p's READY was seen by this CTA
    num_tiles = rounds * (gemm_per_round + copy_per_round)
    tile = tl.atomic_add(tile_ticket_ptr, 1, sem="relaxed", scope="gpu")
    # The ticket loop as a ``for`` over the even share of tiles (+1), then a ``while`` for what programs
    # that started late left: the same draws, but Triton 3.6 compiles a tile loop in a ``for`` better
    # (a plain persistent GEMM, one H200: 0.243 vs 0.266 ms at 16384x512x8192 in a ``while``).
    for _ in range(0, tl.cdiv(num_tiles, tl.num_programs(0)) + 1):
        if tile < num_tiles:
            waited, ready_seen, pending, pending_n, pending_tiles = _rs_tile(
                tile, waited, ready_seen, pending, pending_n, pending_tiles, a_desc, b_desc, stage_desc, recv_desc,
                out_desc, bias_ptr, stage_ptr, recv_ptr, gather_ptr, out_ptr, counters_ptr, done_ptr, recv_flags_ptr,
                epoch, claim_ptr, report_ptr, timeout_ns, rank, N, K, rows, run, out_round_stride, out_offset,
                out_rows, nbands, band_rows, peer_data_ptr, peer_flags_ptr,
                ready_ptr, gather_offset, rs_flag_word, ag_flag_word, ep0, ep1, ep2, ep3, gathered_ptr, rounds,
                copy_per_round, EPILOGUE, WS, BM, BN, BK,
                GROUP_M, B_KMAJOR, HAS_BIAS, AVERAGE, WRITE_GATHER, PRECISION, TIMED, PEER_STORE, TMA, INTERPRET, OP,
                COPY_OUT, SUBTILE, PARTIAL_STAGES, SPAN)
            tile = tl.atomic_add(tile_ticket_ptr, 1, sem="relaxed", scope="gpu")
    while tile < num_tiles:
        waited, ready_seen, pending, pending_n, pending_tiles = _rs_tile(
            tile, waited, ready_seen, pending, pending_n, pending_tiles, a_desc, b_desc, stage_desc, recv_desc,
            out_desc, bias_ptr, stage_ptr, recv_ptr, gather_ptr, out_ptr, counters_ptr, done_ptr, recv_flags_ptr,
            epoch, claim_ptr, report_ptr, timeout_ns, rank, N, K, rows, run, out_round_stride, out_offset,
            out_rows, nbands, band_rows, peer_data_ptr, peer_flags_ptr,
            ready_ptr, gather_offset, rs_flag_word, ag_flag_word, ep0, ep1, ep2, ep3, gathered_ptr, rounds,
            copy_per_round, EPILOGUE, WS, BM, BN, BK,
            GROUP_M, B_KMAJOR, HAS_BIAS, AVERAGE, WRITE_GATHER, PRECISION, TIMED, PEER_STORE, TMA, INTERPRET, OP,
            COPY_OUT, SUBTILE, PARTIAL_STAGES, SPAN)
        tile = tl.atomic_add(tile_ticket_ptr, 1, sem="relaxed", scope="gpu")
    if TMA:
        if pending >= 0:
            count_bulk_stored(counters_ptr, done_ptr, pending, pending_n, pending_tiles, epoch, INTERPRET)
    if tile == num_tiles + tl.num_programs(0) - 1:  # every CTA drew its last ticket: reset for the next call
        tl.atomic_xchg(tile_ticket_ptr, 0, sem="relaxed", scope="gpu")


@triton.jit
def _rs_tile(
    tile, waited, ready_seen, pending, pending_n, pending_tiles,
    a_desc, b_desc, stage_desc, recv_desc, out_desc, bias_ptr, stage_ptr, recv_ptr, gather_ptr, out_ptr,
    counters_ptr, done_ptr, recv_flags_ptr, epoch, claim_ptr, report_ptr, timeout_ns,
    rank, N, K, rows, run, out_round_stride, out_offset, out_rows, nbands, band_rows,
    peer_data_ptr, peer_flags_ptr, ready_ptr, gather_offset, rs_flag_word, ag_flag_word,
    ep0, ep1, ep2, ep3, gathered_ptr, rounds, copy_per_round,
    EPILOGUE: tl.constexpr, WS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    B_KMAJOR: tl.constexpr, HAS_BIAS: tl.constexpr, AVERAGE: tl.constexpr, WRITE_GATHER: tl.constexpr,
    PRECISION: tl.constexpr, TIMED: tl.constexpr, PEER_STORE: tl.constexpr, TMA: tl.constexpr, INTERPRET: tl.constexpr,
    OP: tl.constexpr, COPY_OUT: tl.constexpr, SUBTILE: tl.constexpr, PARTIAL_STAGES: tl.constexpr,
    SPAN: tl.constexpr,
):
    """The work of ticket ``tile``: a GEMM tile (``_gemm_tile``, or ``_span_tile`` where tiles span chunks), or
    with ``COPY_OUT`` a copy tile (``_copy_tile``), in ``_copy_out_order``. Returns the CTA's carried state."""
    is_copy = False  # without COPY_OUT every ticket is a GEMM tile (a constexpr: the branch below is static)
    index = tile
    if COPY_OUT:
        is_copy, index = _copy_out_order(tile, WS * tl.cdiv(rows, BM) * tl.cdiv(N, BN), copy_per_round, rounds)
    if SPAN > 1:
        waited = _span_tile(tile, waited, a_desc, b_desc, bias_ptr, stage_ptr, recv_ptr, out_ptr, counters_ptr,
                            done_ptr, recv_flags_ptr, epoch, claim_ptr, report_ptr, timeout_ns, rank, N, K, rows,
                            out_round_stride, out_offset, out_rows, nbands, ep0, ep1, ep2, ep3, EPILOGUE, WS, SPAN,
                            BM, BN, BK, B_KMAJOR, HAS_BIAS, AVERAGE, PRECISION, TIMED, OP)
    elif is_copy:
        _copy_tile(index, gather_ptr, out_ptr, gathered_ptr, epoch, claim_ptr, report_ptr, timeout_ns, rank, N,
                   rows, out_round_stride, out_rows, nbands, band_rows, WS, BM, BN, GROUP_M, TIMED, OP)
    else:
        waited, ready_seen, pending, pending_n, pending_tiles = _gemm_tile(
            index, waited, ready_seen, pending, pending_n, pending_tiles, a_desc, b_desc, stage_desc, recv_desc,
            out_desc, bias_ptr, stage_ptr, recv_ptr, gather_ptr, out_ptr, counters_ptr, done_ptr, recv_flags_ptr,
            epoch, claim_ptr, report_ptr, timeout_ns, rank, N, K, rows, run, out_round_stride, out_offset,
            out_rows, nbands, band_rows, peer_data_ptr, peer_flags_ptr, ready_ptr, gather_offset, rs_flag_word,
            ag_flag_word, ep0, ep1, ep2, ep3, EPILOGUE, WS, BM, BN, BK, GROUP_M, B_KMAJOR, HAS_BIAS, AVERAGE,
            WRITE_GATHER, PRECISION, TIMED, PEER_STORE, TMA, INTERPRET, OP, SUBTILE, PARTIAL_STAGES)
    return waited, ready_seen, pending, pending_n, pending_tiles


@triton.jit
def _copy_out_order(tile, gemm_per_round, copy_per_round, rounds):
    """(whether ticket ``tile`` is a copy tile, its index among the GEMM tiles or among the copy tiles).
    Order: GEMM tiles of round 0 | GEMM tiles of round 1, copy tiles of round 0 | ... | GEMM tiles of the
    last round, copy tiles of the one before | copy tiles of the last round. A round's copy tiles wait for
    the peers' reduced chunks of that round, which needed this rank's partials of it (earlier tickets
    on every rank): no wait depends on a later ticket, so waits across GPUs form no cycle."""
    span = gemm_per_round + copy_per_round
    after = tile - gemm_per_round  # tickets after round 0's GEMM tiles (negative: one of those)
    t = tl.maximum(after, 0) // span + 1  # which (GEMM round t, copy round t - 1) span; rounds: the last copies
    within = tl.maximum(after, 0) - (t - 1) * span
    last = t >= rounds
    is_copy = (after >= 0) & (last | (within >= gemm_per_round))
    index = tl.where(after < 0, tile,
                     tl.where(last, (rounds - 1) * copy_per_round + within,
                              tl.where(within >= gemm_per_round, (t - 1) * copy_per_round + within - gemm_per_round,
                                       t * gemm_per_round + within)))
    return is_copy, index


@triton.jit
def _copy_tile(j, gather_ptr, out_ptr, gathered_ptr, epoch, claim_ptr, report_ptr, timeout_ns, rank, N, rows,
               out_round_stride, out_rows, nbands, band_rows, WS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
               GROUP_M: tl.constexpr, TIMED: tl.constexpr, OP: tl.constexpr):
    """Copy tile ``j``: one [BM, BN] tile of a peer's reduced chunk, out of this rank's gather region
    into ``out``, once that band's gathered flag is raised (rank+1's chunks first: the order they are
    pushed in). On the SMs, so it overlaps the GEMM (a copy within one GPU runs on the SMs anyway:
    as a driver kernel queued beside this one it waited for it to finish)."""
    tiles_m = tl.cdiv(rows, BM)
    tiles_n = tl.cdiv(N, BN)
    tiles_per_chunk = tiles_m * tiles_n
    per_round = (WS - 1) * tiles_per_chunk
    rnd = j // per_round
    k = j % per_round
    q = (rank + 1 + k // tiles_per_chunk) % WS
    pid_m, pid_n = grouped_tile(k % tiles_per_chunk, tiles_m, tiles_n, GROUP_M)
    slot = rnd * WS + q
    flag = slot * nbands + pid_m // (band_rows // BM)
    wait_flag(gathered_ptr + flag, epoch, claim_ptr, report_ptr, OP, rank, flag + GATHER_FLAG_BASE, nbands,
              timeout_ns, TIMED)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    in_chunk = offs_m < rows
    part = load_rows(gather_ptr, slot * rows + offs_m, in_chunk, offs_n, N, N)
    out_row = rnd * out_round_stride + q * rows + offs_m
    store_rows(out_ptr, out_row, in_chunk & (out_row < out_rows), offs_n, N, N, part)


@triton.jit
def _gemm_tile(
    tile, waited, ready_seen, pending, pending_n, pending_tiles,
    a_desc, b_desc, stage_desc, recv_desc, out_desc, bias_ptr, stage_ptr, recv_ptr, gather_ptr, out_ptr,
    counters_ptr, done_ptr, recv_flags_ptr, epoch, claim_ptr, report_ptr, timeout_ns,
    rank, N, K, rows, run, out_round_stride, out_offset, out_rows, nbands, band_rows,
    peer_data_ptr, peer_flags_ptr, ready_ptr, gather_offset, rs_flag_word, ag_flag_word,
    ep0, ep1, ep2, ep3,
    EPILOGUE: tl.constexpr, WS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    B_KMAJOR: tl.constexpr, HAS_BIAS: tl.constexpr, AVERAGE: tl.constexpr, WRITE_GATHER: tl.constexpr,
    PRECISION: tl.constexpr, TIMED: tl.constexpr, PEER_STORE: tl.constexpr, TMA: tl.constexpr, INTERPRET: tl.constexpr,
    OP: tl.constexpr, SUBTILE: tl.constexpr, PARTIAL_STAGES: tl.constexpr,
):
    """GEMM tile ``tile`` of ``mm_rs_kernel``: the main loop, then either the staged / peer-stored
    remote tile (counted) or the own tile reduced with the peers' partials.
    Returns the CTA's carried state: (waited, ready_seen, pending, pending_n, pending_tiles)."""
    tiles_m = tl.cdiv(rows, BM)
    tiles_n = tl.cdiv(N, BN)
    tiles_per_chunk = tiles_m * tiles_n
    band_tile_rows = band_rows // BM
    rnd = tile // (WS * tiles_per_chunk)
    pos = (tile // tiles_per_chunk) % WS
    chunk = (rank + 1 + pos) % WS  # pos WS-1 is this rank's own chunk
    pid_m, pid_n = grouped_tile(tile % tiles_per_chunk, tiles_m, tiles_n, GROUP_M)
    a_row = rnd * WS * rows + global_row(pid_m * BM, chunk, run, WS)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acc = mainloop(a_desc, a_row, b_desc, pid_n * BN, K, acc, BK, B_KMAJOR, PRECISION)
    slot = rnd * WS + chunk
    band = pid_m // band_tile_rows
    tiles_in_band = tl.minimum(band_tile_rows, tiles_m - band * band_tile_rows) * tiles_n
    if TMA:
        if (pending >= 0) & ((pos == WS - 1) | (pending != slot * nbands + band)):
            # Count the earlier tiles now: their bulk stores had a main loop to drain, so this
            # does not stall on them. Always before this tile's waits (below): a CTA never waits on a
            # peer while holding tiles it has not counted, so waits across GPUs form no cycle.
            count_bulk_stored(counters_ptr, done_ptr, pending, pending_n, pending_tiles, epoch, INTERPRET)
            pending = -1
            pending_n = 0
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    in_chunk = offs_m < rows
    acc = add_bias(acc, bias_ptr, offs_n, N, HAS_BIAS)
    if pos < WS - 1:
        if PEER_STORE:
            ready_seen = _wait_ready(ready_seen, chunk, ready_ptr, epoch, claim_ptr, report_ptr, OP, rank,
                                     timeout_ns, TIMED)
            # the owner's receive buffer holds partials in the GEMM dtype (recv's), whatever
            # dtype the epilogue gives ``out``
            owner_recv = peer_buffer(peer_data_ptr, chunk, 0, recv_ptr.dtype.element_ty)
            store_rows(owner_recv, (rnd * WS + rank) * rows + offs_m, in_chunk, offs_n, N, N, acc)
            owner_flags = tl.load(peer_flags_ptr + chunk).to(tl.pointer_type(tl.int32))
            count_tile_done(counters_ptr + slot * nbands + band,
                            owner_flags + rs_flag_word + (rnd * WS + rank) * nbands + band, tiles_in_band, epoch,
                            SYS=True)
        elif TMA:
            if SUBTILE:
                acc0, acc1 = column_halves(acc, BM, BN)
                stage_desc.store([slot * rows + pid_m * BM, pid_n * BN], acc0.to(stage_ptr.dtype.element_ty))
                stage_desc.store([slot * rows + pid_m * BM, pid_n * BN + BN // 2], acc1.to(stage_ptr.dtype.element_ty))
            else:
                stage_desc.store([slot * rows + pid_m * BM, pid_n * BN], acc.to(stage_ptr.dtype.element_ty))
            pending = slot * nbands + band
            pending_n += 1
            pending_tiles = tiles_in_band
        else:
            store_rows(stage_ptr, slot * rows + offs_m, in_chunk, offs_n, N, N, acc)
            count_tile_done(counters_ptr + slot * nbands + band, done_ptr + slot * nbands + band, tiles_in_band,
                            epoch)
    else:
        key = rnd * nbands + band
        if key > waited:  # a CTA's own tiles come in increasing (round, band) order
            for p in range(1, WS):
                peer = (rank + p) % WS
                flag = (rnd * WS + peer) * nbands + band
                wait_flag(recv_flags_ptr + flag, epoch, claim_ptr, report_ptr, OP, rank, flag, nbands, timeout_ns,
                          TIMED)
            waited = key
            if TMA:  # the acquiring waits above, then TMA (async-proxy) loads of what they guard
                fence_proxy_async(INTERPRET)
        for p in tl.range(1, WS, num_stages=PARTIAL_STAGES):  # PARTIAL_STAGES - 1 partials' loads in flight
            peer = (rank + p) % WS
            if TMA:
                part = recv_desc.load([(rnd * WS + peer) * rows + pid_m * BM, pid_n * BN])
            else:
                part = load_rows(recv_ptr, (rnd * WS + peer) * rows + offs_m, in_chunk, offs_n, N, N)
            acc += part.to(tl.float32)
        if AVERAGE:
            acc = acc / WS
        out_row = rnd * out_round_stride + out_offset + offs_m
        # TMA: the tile's first row in ``out`` (rows past out_rows, the last round's padding, are not stored)
        out_row0 = rnd * out_round_stride + out_offset + pid_m * BM
        if SUBTILE:  # (TMA only) the epilogue and store of each half in turn
            acc0, acc1 = column_halves(acc, BM, BN)
            row_ok = in_chunk & (out_row < out_rows)
            _epilogue_store_half(acc0, out_desc, out_ptr, out_row0, pid_n * BN, out_row, row_ok, N,
                                 ep0, ep1, ep2, ep3, EPILOGUE, BN // 2)
            _epilogue_store_half(acc1, out_desc, out_ptr, out_row0, pid_n * BN + BN // 2, out_row, row_ok, N,
                                 ep0, ep1, ep2, ep3, EPILOGUE, BN // 2)
        else:
            acc = EPILOGUE(acc, out_row, offs_n, (in_chunk & (out_row < out_rows))[:, None] & (offs_n < N)[None, :],
                           N, ep0, ep1, ep2, ep3)
            if TMA:
                out_desc.store([out_row0, pid_n * BN], acc.to(out_ptr.dtype.element_ty))
            else:
                store_rows(out_ptr, out_row, in_chunk & (out_row < out_rows), offs_n, N, N, acc)
        if WRITE_GATHER:
            if PEER_STORE:
                for p in range(1, WS):
                    peer = (rank + p) % WS
                    ready_seen = _wait_ready(ready_seen, peer, ready_ptr, epoch, claim_ptr, report_ptr, OP, rank,
                                             timeout_ns, TIMED)
                    base = tl.load(peer_data_ptr + peer) + gather_offset
                    store_rows(base.to(tl.pointer_type(out_ptr.dtype.element_ty)), slot * rows + offs_m, in_chunk,
                               offs_n, N, N, acc)
                count_tile_done_to_peers(counters_ptr + slot * nbands + band, peer_flags_ptr,
                                         ag_flag_word + slot * nbands + band, tiles_in_band, epoch, rank, WS)
            else:
                store_rows(gather_ptr, slot * rows + offs_m, in_chunk, offs_n, N, N, acc)
                count_tile_done(counters_ptr + slot * nbands + band, done_ptr + slot * nbands + band,
                                tiles_in_band, epoch)
    return waited, ready_seen, pending, pending_n, pending_tiles


@triton.jit
def _span_tile(
    tile, waited, a_desc, b_desc, bias_ptr, stage_ptr, recv_ptr, out_ptr, counters_ptr, done_ptr, recv_flags_ptr,
    epoch, claim_ptr, report_ptr, timeout_ns, rank, N, K, rows, out_round_stride, out_offset, out_rows, nbands,
    ep0, ep1, ep2, ep3,
    EPILOGUE: tl.constexpr, WS: tl.constexpr, SPAN: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    BK: tl.constexpr, B_KMAJOR: tl.constexpr, HAS_BIAS: tl.constexpr, AVERAGE: tl.constexpr,
    PRECISION: tl.constexpr, TIMED: tl.constexpr, OP: tl.constexpr,
):
    """GEMM tile ``tile`` where a chunk is shorter than a tile: the tile covers the ``SPAN`` (= BM / rows)
    consecutive chunks of one group, the groups in the order of the chunks (the one holding this rank's chunk
    last), one band per chunk. Its remote chunks' rows are staged and each of those chunks counted, before any
    wait; in the own group, the own chunk's rows then add the peers' partials and go to ``out``.
    Returns ``waited``."""
    tiles_n = tl.cdiv(N, BN)
    groups = WS // SPAN
    rnd = tile // (groups * tiles_n)
    pos = (tile // tiles_n) % groups
    group = (rank // SPAN + 1 + pos) % groups  # pos groups - 1 holds this rank's own chunk
    pid_n = tile % tiles_n
    first = rnd * WS + group * SPAN  # slot of the tile's first chunk
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acc = mainloop(a_desc, first * rows, b_desc, pid_n * BN, K, acc, BK, B_KMAJOR, PRECISION)
    offs_m = tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    acc = add_bias(acc, bias_ptr, offs_n, N, HAS_BIAS)
    own_row = group * SPAN + offs_m // rows == rank
    store_rows(stage_ptr, first * rows + offs_m, ~own_row, offs_n, N, N, acc)
    for i in tl.static_range(SPAN):
        if group * SPAN + i != rank:
            count_tile_done(counters_ptr + (first + i) * nbands, done_ptr + (first + i) * nbands, tiles_n, epoch)
    if pos == groups - 1:
        if rnd > waited:  # (round, band 0) keys: a CTA's own tiles come in increasing rounds
            for p in range(1, WS):
                flag = (rnd * WS + (rank + p) % WS) * nbands
                wait_flag(recv_flags_ptr + flag, epoch, claim_ptr, report_ptr, OP, rank, flag, nbands, timeout_ns,
                          TIMED)
            waited = rnd
        local = offs_m - (rank - group * SPAN) * rows  # the own chunk's row of each tile row
        for p in range(1, WS):
            part = load_rows(recv_ptr, (rnd * WS + (rank + p) % WS) * rows + local, own_row, offs_n, N, N)
            acc += part.to(tl.float32)
        if AVERAGE:
            acc = acc / WS
        out_row = rnd * out_round_stride + out_offset + local
        row_ok = own_row & (out_row < out_rows)
        acc = EPILOGUE(acc, out_row, offs_n, row_ok[:, None] & (offs_n < N)[None, :], N, ep0, ep1, ep2, ep3)
        store_rows(out_ptr, out_row, row_ok, offs_n, N, N, acc)
    return waited


def span_chunks(rows: int, run: int, BM: int, ws: int, peer_store: bool, gather: bool) -> int:
    """Chunks a tile spans (``_span_tile``; ``knobs.codegen.RS_SPAN_CHUNKS``): BM / rows where contiguous chunks
    (``run == rows``) are shorter than a tile, BM is a multiple of their rows and BM / rows divides ``ws``, staged
    for the copy engine (not ``peer_store``), ``mm_rs`` only (not ``gather``: ``mm_ar``'s rounds); else 1."""
    if (not knobs.codegen.RS_SPAN_CHUNKS or peer_store or gather or run != rows or not 0 < rows < BM
            or BM % rows or ws % (BM // rows)):
        return 1
    return BM // rows


@triton.jit
def _epilogue_store_half(acc, out_desc, out_ptr, row0, col0, out_row, row_ok, N, ep0, ep1, ep2, ep3,
                         EPILOGUE: tl.constexpr, HALF: tl.constexpr):
    """The epilogue and TMA store of one [BM, HALF] column block of an own tile starting at ``col0``."""
    offs_n = col0 + tl.arange(0, HALF)
    acc = EPILOGUE(acc, out_row, offs_n, row_ok[:, None] & (offs_n < N)[None, :], N, ep0, ep1, ep2, ep3)
    out_desc.store([row0, col0], acc.to(out_ptr.dtype.element_ty))


@triton.jit
def _wait_ready(ready_seen, peer, ready_ptr, epoch, claim_ptr, report_ptr, OP: tl.constexpr, rank, timeout_ns,
                TIMED: tl.constexpr):
    """Before this CTA's first store into ``peer``'s buffers: wait until ``peer`` started this call
    (its READY flag), i.e. finished reading them in its previous one."""
    if ((ready_seen >> peer) & 1) == 0:
        wait_flag(ready_ptr + peer, epoch, claim_ptr, report_ptr, OP, rank, peer + READY_FLAG_BASE, 1, timeout_ns,
                  TIMED)
        ready_seen = ready_seen | (1 << peer)
    return ready_seen


def tma_ok(rows: int, run: int, BM: int, peer_store: bool, copy_out: bool = False) -> bool:
    """Whether a config's ``tma`` variant applies: the copy-engine transport (a staged tile is counted after
    its bulk store completed), contiguous chunks whose rows BM divides (a TMA tile never straddles two chunks),
    ``mm_ar``'s rounds without its copy tiles (which wait for peers)."""
    return not peer_store and not copy_out and run == rows and rows % BM == 0


def launch(a, b, bias, stage, recv, gather, out, counters, done, recv_flags, ticket, epoch, status, timeout_ns,
           rank, ws, rows, run, rounds, out_round_stride, out_offset, average, band_rows, config, num_sms,
           timed=True, peer=None, epilogue=None, ep_ptrs=(), gathered=None):
    """See the module docstring. ``stage``/``recv``/``gather``: [rounds * ws * rows, N];
    ``counters``/``done``/``recv_flags``: rounds * ws * nbands int32 each (nbands = rows / band_rows
    rounded up; ``band_rows`` % BM == 0); ``ticket``: one int32 (0 between
    calls); ``gather`` None for ``mm_rs``; ``status``: (claim word, report) pointers.

    ``peer``: None (copy-engine transport: stage, the host pushes) or a dict for PEER_STORE with
    ``data`` / ``flags`` (int64 tensors: every rank's data / flag buffer address), ``ready`` (this
    rank's READY flags), ``gather_offset`` (bytes from a data buffer to its gather region),
    ``rs_flag_word`` / ``ag_flag_word`` (word index of the receive / gather flags in a flag buffer).

    ``gathered`` (``mm_ar`` only; None: the host copies them out): this rank's gathered flags
    (``rounds * ws * nbands`` int32, raised as the peers' reduced bands land in ``gather``); the kernel
    then copies those bands into ``out`` itself (copy tiles, ``COPY_OUT``).

    ``epilogue`` (a ``codegen.epilogue.Generated``; None: identity) runs on the own chunk's reduced
    tiles before they are stored into ``out`` (rows of ``out``), with ``ep_ptrs`` as ``P0..P3``;
    ``mm_ar`` (``gather`` given) takes none: its reduced tiles are also what peers receive."""
    assert epilogue is None or gather is None, "mm_ar's reduced tiles are shipped: no fused epilogue"
    if config[6] in GLUON_STORES:  # the warp-specialized Gluon kernel (Hopper; imported only where it runs)
        from . import mm_rs_ws

        return mm_rs_ws.launch(a, b, bias, stage, recv, gather, out, counters, done, recv_flags, ticket, epoch, status,
                               timeout_ns, rank, ws, rows, run, rounds, out_round_stride, out_offset, average,
                               band_rows, config, num_sms, timed, epilogue, ep_ptrs, peer_store=peer is not None,
                               copy_out=gathered is not None)
    fn, ptrs = epilogue_fn(epilogue, ep_ptrs, a.dtype, out)
    M, K = a.shape
    N = b.shape[1]
    BM, BN, BK, GROUP_M, stages, warps, store = config
    tma, subtile, warp_spec, flatten = store_variant(store)
    if warp_spec or flatten:  # its tiles come from an atomic ticket, not from a static loop
        raise ValueError(f"mm_rs has no warp-specialized or flattened tile loop (config store {store!r})")
    assert band_rows % BM == 0, (band_rows, BM)
    assert not tma or tma_ok(rows, run, BM, peer is not None, gathered is not None), (
        rows, run, BM, peer is not None, gathered is not None)
    GROUP_M = max(1, min(GROUP_M, band_rows // BM))  # a group of row-tiles stays inside one band
    assert gathered is None or gather is not None, "copy tiles: mm_ar's rounds"
    span = span_chunks(rows, run, BM, ws, peer is not None, gather is not None)
    assert span == 1 or (not tma and band_rows >= rows), (span, tma, band_rows, rows)  # pointer stores, one band
    if span > 1:
        tiles_per_round = ws // span * launcher.cdiv(N, BN)
    else:
        tiles_per_round = (2 * ws - 1 if gathered is not None else ws) * launcher.cdiv(rows, BM) * launcher.cdiv(N, BN)
    grid = launcher.Persistent(rounds * tiles_per_round, num_sms, knobs.codegen.PERSISTENT_CTAS_PER_SM)
    b_kmajor = b.stride(0) == 1 and b.stride(1) == K
    launcher.launch(mm_rs_kernel, grid,
        a, b.t() if b_kmajor else b, bias if bias is not None else out, stage, recv,
        gather if gather is not None else out, out,
        counters, done, recv_flags, ticket, gathered if gathered is not None else counters, epoch, *status, timeout_ns,
        rank, M, N, K, rows, run, rounds, out_round_stride, out_offset, out.shape[0], band_rows,
        max(1, launcher.cdiv(rows, band_rows)),
        *((peer["data"], peer["flags"], peer["ready"], peer["gather_offset"], peer["rs_flag_word"],
           peer["ag_flag_word"]) if peer is not None else (counters, counters, counters, 0, 0, 0)), *ptrs,
        EPILOGUE=fn, WS=ws, BM=BM, BN=BN, BK=BK, GROUP_M=GROUP_M, B_KMAJOR=b_kmajor, HAS_BIAS=bias is not None,
        AVERAGE=average, WRITE_GATHER=gather is not None,
        PRECISION="ieee" if a.dtype == torch.float32 else None, TIMED=timed, PEER_STORE=peer is not None,
        TMA=tma, INTERPRET=launcher.interpreting(), COPY_OUT=gathered is not None, SUBTILE=subtile,
        PARTIAL_STAGES=knobs.codegen.RS_PARTIAL_STAGES, SPAN=span, num_stages=stages, num_warps=warps,
    )
    return out
