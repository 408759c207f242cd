"""``mm_rs`` producer, warp-specialized (Gluon, Hopper): ``mm_rs_kernel``'s tiles, ticket order, staging, band
counting and own-chunk reduction, in three partitions instead of one loop, so that the next tiles' loads run
during a tile's epilogue and one MMA warpgroup's epilogue during the other's main loop (the config's store field
``ws_pingpong``, ``ws_pingpong_direct`` or ``ws_coop``; ``codegen/gluon_ring.py`` has the ring). With TMA stores
only: contiguous chunks whose rows a tile divides, on the copy-engine transport (``mm_rs.tma_ok``); ``mm_ar``'s
rounds too, each round's own tiles also stored into the gather region and counted for the all-gather
(``WRITE_GATHER``).

- The loader (1 warp) draws the tiles from the atomic ticket (the remote chunks rank+1, rank+2, ... first, the own
  chunk last; a CTA that is not resident holds no tile a peer waits for), hands each tile's number to its MMA
  warpgroup through a small ring of its own (``ids``; -1: no more tiles) and fills the stage ring with its K-chunks.
- Two MMA warpgroups take the CTA's tiles in turns (ping-pong, as ``ag_mm_ws``), or share each tile, each computing
  half its rows (``ws_coop``: 128 x 256 tiles, by TMA stores; each half counted as half a tile). A remote tile
  (+ bias) goes to ``stage`` by TMA and is counted as soon as its store completed (``count_bulk_stored``: the
  band's last tile raises its done flag, which the copy engine waits for); ``ws_pingpong_direct``: by the warpgroup's own 16-byte stores
  through shared memory, counted at once (``count_tile_done``: the count's release orders them, no wait for a
  TMA store's completion, a microsecond or more, which a short-K main loop of the other warpgroup does not cover).
  Counting at once, before the warpgroup waits for anything else, is what keeps waits across GPUs acyclic: no
  partition waits (for its turn, its stages or a peer) while it holds a stored tile it has not counted. An own tile waits, after its main loop, for every peer's partial of its band
  (acquire, system scope, bounded; once per band per warpgroup), then sums them in its epilogue.
- The own tile's epilogue runs on pieces of the tile in shared memory, in a loop (``gluon_ring.epilogue_in_pieces``,
  ``knobs.codegen.GLUON_EPILOGUE_VALUES`` values a thread): the accumulator (+ bias) is rounded to the GEMM's dtype
  into the store buffer, then each piece adds the peers' partials (float32), averages, runs the generated
  epilogue and goes back, and the tile leaves by one TMA store (``mm_ar``: two, into ``out`` and into its slot of
  the gather region, then counted once both completed). The own partial is rounded before the sum, as the unfused
  graph's GEMM output is (``mm_rs_kernel`` sums the float32 accumulator).

A wait that gives up claims the report as ``mm_rs_kernel``'s does; the kernel finishes and the host raises. What it
does not do (``launch`` raises ``ValueError``; ``mm_rs``'s other variants do): ``mm_ar``'s copy tiles
(``knobs.symm.AR_KERNEL_COPY_OUT``), peer stores, chunks that are not contiguous or whose rows a tile does not
divide, float32, an output of another dtype than the GEMM's, the cooperative form with stores by the threads.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from . import launcher
from .epilogue import epilogue_fn
from .flags import OP_MM_AR, OP_MM_RS, count_bulk_stored, count_tile_done, wait_flag
from .gluon_ring import (LOAD_REGS, MAXNREG, MMA_REGS, WARPS, acc_layout, allocate_ring, b_descriptor,
                         epilogue_in_pieces, epilogue_values, finish_tile, load_stage, mma_tile, partition_barrier,
                         partition_descriptor, refusal, shared_to_tma, slice_cols, slice_layout, store_rows, store_tile,
                         tma_store)
from .tiles import grouped_tile

ID_SLOTS = gl.constexpr(4)  # tile numbers the loader may hand out ahead of the MMA warpgroups


@gluon.constexpr_function
def _id_layout(warps):
    return gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32], warps_per_cta=[warps], order=[0])


@gluon.jit
def _put_id(ids, id_ready, id_empty, i, value):
    """The loader: the CTA's i-th tile is ``value`` (its slot free again once its reader took the number)."""
    s = i % ids.type.shape[0]
    mbarrier.wait(id_empty.index(s), ((i // ids.type.shape[0]) & 1) ^ 1)
    ids.index(s).store(gl.full([1], value, gl.int32, layout=_id_layout(1)))
    mbarrier.arrive(id_ready.index(s))  # (release: the store above comes first)


@gluon.jit
def _take_id(ids, id_ready, id_empty, i):
    """An MMA warpgroup: the CTA's i-th tile's number (-1: none left)."""
    s = i % ids.type.shape[0]
    mbarrier.wait(id_ready.index(s), (i // ids.type.shape[0]) & 1)
    tile = gl.max(ids.index(s).load(_id_layout(4)), axis=0)
    partition_barrier()  # every thread read it before the slot is handed back
    mbarrier.arrive(id_empty.index(s))
    return tile


@gluon.jit
def _round_of(tile, per_round, ROUNDS: gl.constexpr):
    """The round of ticket ``tile`` (``ROUNDS``: ``mm_ar``'s rounds; ``mm_rs`` has one, 0 at compile time: no
    register spent on it, which ptxas spilled for at 8 ranks)."""
    if ROUNDS:
        rnd = tile // per_round
    else:
        rnd = 0
    return rnd


@gluon.jit
def _load_tiles(a_ptr, b_ptr, a_bufs, b_bufs, ready, empty, ids, id_ready, id_empty, ticket_ptr, rank, M, rows, N, K,
                rounds, WS: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, GROUP_M: gl.constexpr,
                B_KMAJOR: gl.constexpr, ROUNDS: gl.constexpr, COOP: gl.constexpr):
    """The loader partition: every tile this CTA draws, its number to its warpgroup (both, cooperative) and its
    K-chunks to the ring. It makes its TMA descriptors itself (``gluon_ring.partition_descriptor``)."""
    SUB_M: gl.constexpr = a_bufs.type.shape[1]  # (cooperative: each warpgroup's half of a tile's rows, a box each)
    a_desc = partition_descriptor(a_ptr, M, K, SUB_M, BK)  # (the last round's rows past M: TMA's zeros)
    b_desc = b_descriptor(b_ptr, N, K, BN, BK, B_KMAJOR)
    tiles_m = gl.cdiv(rows, BM)
    tiles_n = gl.cdiv(N, BN)
    per_chunk = tiles_m * tiles_n
    num_tiles = rounds * WS * per_chunk
    k_iters = gl.cdiv(K, BK)
    p = 0
    i = 0
    tile = gl.atomic_add(ticket_ptr, 1, sem="relaxed", scope="gpu")
    while tile < num_tiles:
        rnd = _round_of(tile, WS * per_chunk, ROUNDS)
        chunk = (rank + 1 + (tile // per_chunk) % WS) % WS
        pid_m, pid_n = grouped_tile(tile % per_chunk, tiles_m, tiles_n, GROUP_M)
        _put_id(ids, id_ready, id_empty, i, tile)
        for ki in range(k_iters):
            p = load_stage(a_desc, (rnd * WS + chunk) * rows + pid_m * BM, b_desc, pid_n * BN, ki * BK, a_bufs,
                           b_bufs, ready, empty, p, B_KMAJOR)
        i += 1
        tile = gl.atomic_add(ticket_ptr, 1, sem="relaxed", scope="gpu")
    _put_id(ids, id_ready, id_empty, i, -1)  # one end mark for each warpgroup (cooperative: both read this one)
    if not COOP:
        _put_id(ids, id_ready, id_empty, i + 1, -1)
    if tile == num_tiles + gl.num_programs(0) - 1:  # every CTA drew its last ticket: reset for the next call
        gl.atomic_xchg(ticket_ptr, 0, sem="relaxed", scope="gpu")


@gluon.jit
def _stage_direct(acc, c_buf, bias_ptr, stage_ptr, row0, col0, N, HAS_BIAS: gl.constexpr, EP_VALUES: gl.constexpr):
    """A remote tile (+ bias) into ``stage`` by the warpgroup's own stores, through ``c_buf`` so that each thread
    stores 16 bytes of a row at a time; counted right after without waiting for completion (the count's release
    orders them), where a TMA store must have completed first."""
    BM: gl.constexpr = acc.type.shape[0]
    BN: gl.constexpr = acc.type.shape[1]
    if HAS_BIAS:
        offs_n = col0 + gl.arange(0, BN, layout=gl.SliceLayout(0, acc.type.layout))
        bias = gl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
        acc = acc + gl.expand_dims(bias.to(gl.float32), 0)
    tma.store_wait(0)  # the last TMA store from c_buf (an own tile's) has read it ...
    partition_barrier()  # ... before any thread overwrites it
    c_buf.store(acc.to(c_buf.dtype))
    COLS: gl.constexpr = slice_cols(BM, BN, EP_VALUES)
    partition_barrier()  # every thread's part of the tile in c_buf before any thread reads another's
    r = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, slice_layout(BM, COLS)))
    store_rows(c_buf, stage_ptr, r, r >= row0, col0, N, COLS)


@gluon.jit
def _mma_tiles(a_bufs, b_bufs, c_bufs, ready, empty, turn, ids, id_ready, id_empty, stage_ptr, out_ptr,
               bias_ptr, recv_ptr, gather_ptr, counters_ptr, done_ptr, recv_flags_ptr, epoch, claim_ptr, report_ptr,
               timeout_ns, rank, rows, N, K, rounds, out_round_stride, out_offset, out_rows, nbands, band_rows, ep0, ep1,
               ep2, ep3, WS: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, GROUP_M: gl.constexpr,
               ME: gl.constexpr, B_KMAJOR: gl.constexpr, HAS_BIAS: gl.constexpr, AVERAGE: gl.constexpr, TIMED: gl.constexpr,
               EPILOGUE: gl.constexpr, IDENTITY: gl.constexpr, EP_VALUES: gl.constexpr, DIRECT: gl.constexpr,
               WRITE_GATHER: gl.constexpr, COOP: gl.constexpr):
    """MMA warpgroup ``ME`` (0 or 1). Ping-pong: the CTA's tiles ME, ME + 2, ... (its i-th tile is ring positions
    [i * k_iters, (i + 1) * k_iters)), each main loop in its turn. Cooperative: rows [ME * BM / 2, (ME + 1) * BM / 2)
    of every tile of the CTA. Then its rows of a remote tile staged and counted, or of the own tile reduced and
    stored. It makes its TMA descriptors itself (``gluon_ring.partition_descriptor``)."""
    SUB_M: gl.constexpr = c_bufs.type.shape[1]
    PARTS: gl.constexpr = BM // SUB_M  # (the warpgroups that store parts of a tile, each counted)
    stage_desc = partition_descriptor(stage_ptr, rounds * WS * rows, N, SUB_M, BN)
    out_desc = partition_descriptor(out_ptr, out_rows, N, SUB_M, BN)
    if WRITE_GATHER:
        gather_desc = partition_descriptor(gather_ptr, rounds * WS * rows, N, SUB_M, BN)
    else:  # (mm_rs: no gather region, no descriptor made for it)
        gather_desc = stage_desc
    tiles_m = gl.cdiv(rows, BM)
    tiles_n = gl.cdiv(N, BN)
    per_chunk = tiles_m * tiles_n
    k_iters = gl.cdiv(K, BK)
    band_tile_rows = band_rows // BM
    OP: gl.constexpr = OP_MM_AR if WRITE_GATHER else OP_MM_RS  # (the op a wait that gives up reports)
    c_buf = c_bufs.index(ME)
    acc = gl.zeros((SUB_M, BN), dtype=gl.float32, layout=acc_layout(BN))
    waited = -1  # this warpgroup saw every peer's partial of the (round, band)s up to this one
    STEP: gl.constexpr = 1 if COOP else 2  # (the CTA's tiles this warpgroup takes: every one, or every other)
    i = 0 if COOP else ME
    tile = _take_id(ids, id_ready, id_empty, i)
    while tile >= 0:
        rnd = _round_of(tile, WS * per_chunk, WRITE_GATHER)
        pos = (tile // per_chunk) % WS
        chunk = (rank + 1 + pos) % WS
        slot = rnd * WS + chunk
        pid_m, pid_n = grouped_tile(tile % per_chunk, tiles_m, tiles_n, GROUP_M)
        if COOP:
            acc, p = mma_tile(acc, a_bufs, b_bufs, ready, empty, i * k_iters, k_iters, ME, B_KMAJOR)
        else:
            # warpgroup 0 goes first: on a fresh barrier a wait for the parity before phase 0 passes at once
            mbarrier.wait(turn.index(ME), ((i // 2) & 1) ^ (1 - ME))
            acc, p = mma_tile(acc, a_bufs, b_bufs, ready, empty, i * k_iters, k_iters, 0, B_KMAJOR)
            mbarrier.arrive(turn.index(1 - ME))
        acc = finish_tile(acc, empty, p)
        row = pid_m * BM + (ME * SUB_M if COOP else 0)  # this warpgroup's first row of the tile, in its chunk
        band = pid_m // band_tile_rows
        index = slot * nbands + band
        parts_in_band = gl.minimum(band_tile_rows, tiles_m - band * band_tile_rows) * tiles_n * PARTS
        if pos < WS - 1:
            if DIRECT:
                _stage_direct(acc, c_buf, bias_ptr, stage_ptr, slot * rows + row, pid_n * BN, N, HAS_BIAS, EP_VALUES)
                count_tile_done(counters_ptr + index, done_ptr + index, parts_in_band, epoch)
            else:
                store_tile(acc, stage_desc, c_buf, bias_ptr, slot * rows + row, pid_n * BN, N, ep0, ep1, ep2,
                           ep3, HAS_BIAS, IDENTITY, 0)
                count_bulk_stored(counters_ptr, done_ptr, index, 1, parts_in_band, epoch, False)
        else:
            key = rnd * nbands + band
            if key > waited:  # a warpgroup's own tiles come in increasing (round, band) order
                for q in range(1, WS):
                    flag = (rnd * WS + (rank + q) % WS) * nbands + band
                    wait_flag(recv_flags_ptr + flag, epoch, claim_ptr, report_ptr, OP, rank, flag, nbands,
                              timeout_ns, TIMED)
                waited = key
            offs_n = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, acc.type.layout))
            if HAS_BIAS:
                bias = gl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
                acc = acc + gl.expand_dims(bias.to(gl.float32), 0)
            tma.store_wait(0)  # the last store from c_buf has read it ...
            partition_barrier()  # ... before any thread overwrites it
            c_buf.store(acc.to(c_buf.dtype))
            # (this round's partials: rows rnd * WS * rows + peer * rows + ... of recv)
            epilogue_in_pieces(c_buf, row, pid_n * BN, N, ep0, ep1, ep2, ep3, EPILOGUE, EP_VALUES,
                               recv_ptr + (rnd * WS * rows).to(gl.int64) * N, rank, rows, WS, AVERAGE)
            shared_to_tma()
            tma_store(out_desc, [rnd * out_round_stride + out_offset + row, pid_n * BN], c_buf)
            if WRITE_GATHER:  # mm_ar: the reduced tile is also this rank's part of the round's all-gather
                tma_store(gather_desc, [slot * rows + row, pid_n * BN], c_buf)
                count_bulk_stored(counters_ptr, done_ptr, index, 1, parts_in_band, epoch, False)
        i += STEP
        tile = _take_id(ids, id_ready, id_empty, i)
    tma.store_wait(0)  # no exit while a TMA store still reads this CTA's shared memory


@gluon.jit(do_not_specialize=["epoch"])  # per-call values: see launcher.py
def mm_rs_ws_kernel(
    a_ptr, b_ptr, bias_ptr, stage_ptr, recv_ptr, gather_ptr, out_ptr,
    counters_ptr, done_ptr, recv_flags_ptr, ticket_ptr, epoch, claim_ptr, report_ptr, timeout_ns,
    rank, M, rows, N, K, rounds, out_round_stride, out_offset, out_rows, band_rows, nbands, ep0, ep1, ep2, ep3,
    EPILOGUE: gl.constexpr, IDENTITY: gl.constexpr, EP_VALUES: gl.constexpr, WS: gl.constexpr, BM: gl.constexpr,
    BN: gl.constexpr, BK: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, B_KMAJOR: gl.constexpr,
    HAS_BIAS: gl.constexpr, AVERAGE: gl.constexpr, TIMED: gl.constexpr, DIRECT: gl.constexpr,
    WRITE_GATHER: gl.constexpr, COOP: gl.constexpr, MMA_REGS: gl.constexpr, LOAD_REGS: gl.constexpr,
):
    dtype: gl.constexpr = a_ptr.dtype.element_ty
    # cooperative: each MMA partition's half of the rows, its own A box; both read each tile's number
    a_bufs, b_bufs, c_bufs, ready, empty, turn = allocate_ring(dtype, dtype, STAGES, BM, BN, BK, 2 if COOP else 1,
                                                               B_KMAJOR)
    ids = gl.allocate_shared_memory(gl.int32, [ID_SLOTS, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    id_ready = gl.allocate_shared_memory(gl.int64, [ID_SLOTS, 1], mbarrier.MBarrierLayout())
    id_empty = gl.allocate_shared_memory(gl.int64, [ID_SLOTS, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(ID_SLOTS):
        mbarrier.init(id_ready.index(s), count=1)
        mbarrier.init(id_empty.index(s), count=2 if COOP else 1)
    # (argument tuples written out in place: a tuple held in a variable turns its constexprs into tensors)
    gl.warp_specialize([
        (_mma_tiles, (a_bufs, b_bufs, c_bufs, ready, empty, turn, ids, id_ready, id_empty, stage_ptr, out_ptr,
                      bias_ptr, recv_ptr, gather_ptr, counters_ptr, done_ptr, recv_flags_ptr, epoch, claim_ptr,
                      report_ptr, timeout_ns, rank, rows, N, K, rounds, out_round_stride, out_offset, out_rows, nbands,
                      band_rows, ep0, ep1, ep2, ep3, WS, BM, BN, BK, GROUP_M, 0, B_KMAJOR, HAS_BIAS, AVERAGE, TIMED,
                      EPILOGUE, IDENTITY, EP_VALUES, DIRECT, WRITE_GATHER, COOP)),
        (_mma_tiles, (a_bufs, b_bufs, c_bufs, ready, empty, turn, ids, id_ready, id_empty, stage_ptr, out_ptr,
                      bias_ptr, recv_ptr, gather_ptr, counters_ptr, done_ptr, recv_flags_ptr, epoch, claim_ptr,
                      report_ptr, timeout_ns, rank, rows, N, K, rounds, out_round_stride, out_offset, out_rows, nbands,
                      band_rows, ep0, ep1, ep2, ep3, WS, BM, BN, BK, GROUP_M, 1, B_KMAJOR, HAS_BIAS, AVERAGE, TIMED,
                      EPILOGUE, IDENTITY, EP_VALUES, DIRECT, WRITE_GATHER, COOP)),
        (_load_tiles, (a_ptr, b_ptr, a_bufs, b_bufs, ready, empty, ids, id_ready, id_empty, ticket_ptr, rank, M,
                       rows, N, K, rounds, WS, BM, BN, BK, GROUP_M, B_KMAJOR, WRITE_GATHER, COOP)),
    ], [4, 1], [MMA_REGS, LOAD_REGS])  # the second MMA partition one warpgroup, the loader one warp


STORES = ("ws_pingpong", "ws_pingpong_direct", "ws_coop")


def unsupported(rows: int, run: int, config, dtype: torch.dtype, out_dtype: torch.dtype, peer_store: bool,
                copy_out: bool = False) -> str | None:
    """Why ``launch`` cannot run ``config`` (None: it can); ``copy_out``: ``mm_ar``'s copy tiles are asked for."""
    BM, warps, store = config[0], config[5], config[6]
    why = refusal(store, STORES, warps, dtype, BM)
    if why:
        return why
    if out_dtype != dtype:
        return f"an output of the GEMM's dtype only, not {out_dtype}"
    if peer_store or copy_out:
        return "the copy-engine transport only (no peer stores, no copy tiles)"
    if run != rows or rows % BM:
        return f"TMA stores need contiguous chunks whose rows ({rows}, runs of {run}) BM={BM} divides"
    return None


def launch(a, b, bias, stage, recv, gather, out, counters, done, recv_flags, ticket, epoch, status, timeout_ns, rank,
           ws, rows, run, rounds, out_round_stride, out_offset, average, band_rows, config, num_sms, timed=True,
           epilogue=None, ep_ptrs=(), peer_store=False, copy_out=False):
    """``mm_rs.launch``'s contract for a ``ws_pingpong`` / ``ws_pingpong_direct`` / ``ws_coop`` config (``gather``:
    ``mm_ar``'s gather region, None for ``mm_rs``; ``peer_store``, ``copy_out``: whether ``mm_rs.launch`` has peer
    stores, copy tiles); see ``unsupported`` for what it refuses."""
    M, K = a.shape
    N = b.shape[1]
    BM, BN, BK, GROUP_M, stages, _warps, store = config
    why = unsupported(rows, run, config, a.dtype, out.dtype, peer_store, copy_out)
    if why:
        raise ValueError(f"mm_rs's {store} kernel: {why}")
    if band_rows % BM:
        raise ValueError(f"band_rows {band_rows} is not a multiple of BM {BM}")
    b_kmajor = b.stride(0) == 1 and b.stride(1) == K
    fn, ptrs = epilogue_fn(epilogue, ep_ptrs, a.dtype, out)
    identity, _ = epilogue_fn(None, (), a.dtype, out)
    grid = launcher.Persistent(rounds * ws * launcher.cdiv(rows, BM) * launcher.cdiv(N, BN), num_sms, 1)
    launcher.launch(mm_rs_ws_kernel, grid,
        a, b.t() if b_kmajor else b, bias if bias is not None else out, stage, recv,
        gather if gather is not None else stage, out,
        counters, done, recv_flags, ticket, epoch, *status, timeout_ns,
        rank, M, rows, N, K, rounds, out_round_stride, out_offset, out.shape[0], band_rows,
        max(1, launcher.cdiv(rows, band_rows)), *ptrs,
        EPILOGUE=fn, IDENTITY=identity, EP_VALUES=epilogue_values(), WS=ws, BM=BM, BN=BN, BK=BK,
        GROUP_M=max(1, min(GROUP_M, band_rows // BM)), STAGES=stages, B_KMAJOR=b_kmajor, HAS_BIAS=bias is not None,
        AVERAGE=average, TIMED=timed, DIRECT=store == "ws_pingpong_direct", WRITE_GATHER=gather is not None,
        COOP=store == "ws_coop", MMA_REGS=MMA_REGS, LOAD_REGS=LOAD_REGS,
        num_warps=WARPS, maxnreg=MAXNREG,
    )
    return out
