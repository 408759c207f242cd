"""``moe_experts``' down GEMM, warp-specialized (Gluon, Hopper): ``moe_gemm.down_kernel``'s tiles, tile order, row
scatter and per-source counting, in three partitions instead of one loop, so that the next tiles' loads run during a
tile's epilogue (the config's store field ``ws_pingpong`` or ``ws_coop``; ``codegen/gluon_ring.py`` has the ring).
At DeepSeek-like prefill sizes (K = 2048: 32 K-steps a tile) the ``tl`` kernel's epilogue, which no main loop
overlaps there, is what keeps it above ``torch._grouped_mm``.

- The loader (1 warp) walks the CTA's tiles (tile ``first + pid``, ``+ grid``, ... of the launch's groups, in
  ``moe_tiles.tile_group``'s order) and fills the ring with each tile's rows of ``act`` (sorted order: a row tile is
  a contiguous block; rows past the group's end are computed and never stored) and its expert's weight block.
- Two MMA warpgroups either take the tiles in turns (``ws_pingpong``, 128 x 128: one's epilogue under the other's
  main loop) or share each tile, each computing half its rows (``ws_coop``, 128 x 256). Each stores its rows as
  ``down_kernel`` does: a full tile of a group whose rows are consecutive by one TMA store (into ``out`` for this
  rank's own rows, else into the staging buffer), other tiles by pointer stores to each row's place. A remote part
  is counted per source position (each warpgroup's half of a shared tile counts once, against twice the tiles):
  stored by pointers, at once; by TMA, at the warpgroup's next epilogue, which waits for that store anyway before it
  writes its store buffer again (or at its end). The count that completes a source raises its done flag, which the
  combine waits for; no partition waits for anything outside the CTA, so the deferred count cannot deadlock.

The weights are read through one 2-D TMA descriptor over the stacked experts (``[E * K, N]``, or ``[E * N, K]`` for
weights stored as ``F.linear`` reads them), so an expert's K must be a multiple of BK (a block never reaches the
next expert's rows of K; past N it reads the next expert's rows into columns that are never stored). What it does
not do (``launch`` raises ``ValueError``; ``down_kernel`` does these): weights whose experts are not stacked densely,
K not a multiple of BK, outputs the TMA cannot store into (``moe_tiles.tma_stores``) or of another dtype than
``act``, float32.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from . import launcher
from .flags import count_bulk_stored, count_tile_done, signal_flag
from .gluon_ring import (LOAD_REGS, MAXNREG, MMA_REGS, WARPS, acc_layout, allocate_ring, b_descriptor, finish_tile,
                         load_stage, mma_tile, partition_barrier, partition_descriptor, refusal, shared_to_tma,
                         slice_cols, slice_layout, store_rows, tma_store)
from .moe_tiles import expert_layout, log_groups, tile_group, tma_stores


@gluon.jit
def _tile(t, tiles_n, tile_start_ptr, row_start_ptr, counts_ptr, G, E, LOG_G: gl.constexpr, BM: gl.constexpr,
          WS: gl.constexpr, EXPERT_MAJOR: gl.constexpr, GROUP_M: gl.constexpr):
    """Tile t -> (group, expert, source position, column tile, first sorted row, the group's rows from it on)."""
    g, e, pos, pid_m, pid_n = tile_group(t, tiles_n, tile_start_ptr, G, E, LOG_G, WS, EXPERT_MAJOR, GROUP_M)
    return g, e, pos, pid_n, gl.load(row_start_ptr + g) + pid_m * BM, gl.load(counts_ptr + g) - pid_m * BM


@gluon.jit
def _load_tiles(act_ptr, w_ptr, a_bufs, b_bufs, ready, empty, tile_start_ptr, row_start_ptr, counts_ptr,
                M, H, F, G, E, group_lo, group_hi, w_rows,
                WS: gl.constexpr, LOG_G: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                GROUP_M: gl.constexpr, EXPERT_MAJOR: gl.constexpr, B_KMAJOR: gl.constexpr):
    """The loader partition: every K-chunk of every tile of this CTA. It makes its TMA descriptors itself
    (``gluon_ring.partition_descriptor``); ``w_rows``: the stacked weights' rows (E * N K-major, else E * K)."""
    SUB_M: gl.constexpr = a_bufs.type.shape[1]
    a_desc = partition_descriptor(act_ptr, M, F, SUB_M, BK)
    if B_KMAJOR:
        b_desc = b_descriptor(w_ptr, w_rows, F, BN, BK, True)
    else:
        b_desc = b_descriptor(w_ptr, H, w_rows, BN, BK, False)
    tiles_n = gl.cdiv(H, BN)
    k_iters = gl.cdiv(F, BK)
    first_tile = gl.load(tile_start_ptr + group_lo) * tiles_n
    end_tile = gl.load(tile_start_ptr + group_hi) * tiles_n
    p = 0
    for tile in range(first_tile + gl.program_id(0), end_tile, gl.num_programs(0)):
        g, e, pos, pid_n, row, rows_left = _tile(tile, tiles_n, tile_start_ptr, row_start_ptr, counts_ptr, G, E, LOG_G,
                                                 BM, WS, EXPERT_MAJOR, GROUP_M)
        for ki in range(k_iters):
            if B_KMAJOR:  # expert e's [N, K] rows start at e * N
                p = load_stage(a_desc, row, b_desc, e * H + pid_n * BN, ki * BK, a_bufs, b_bufs, ready, empty, p, True)
            else:  # expert e's [K, N] rows start at e * K
                p = load_stage(a_desc, row, b_desc, pid_n * BN, ki * BK, a_bufs, b_bufs, ready, empty, p, False,
                               e * F)


@gluon.jit
def _store_part(acc, c_buf, out_desc, stage_desc, out_ptr, stage_ptr, srows_ptr, counters_ptr, done_ptr, src_tiles_ptr,
                epoch, row, rows_here, by_tma, own, own_shift, pos, col0, H, tiles_n, pending,
                PARTS: gl.constexpr):
    """This warpgroup's ``SUB_M`` rows of a tile (sorted rows from ``row``, ``rows_here`` of them in the group) to
    their places: own rows into ``out`` at ``srow + own_shift``, remote ones into the staging buffer at ``srow``; by
    TMA where ``by_tma`` (consecutive rows), else by pointer stores. Counts the part stored by TMA before
    (``pending``: its source position, -1: none) once that store completed, a remote part stored by pointers at once.
    Returns the new ``pending``."""
    SUB_M: gl.constexpr = c_buf.type.shape[0]
    BN: gl.constexpr = c_buf.type.shape[1]
    tma.store_wait(0)  # the last TMA store from c_buf is complete: it read c_buf, and its tiles may be counted ...
    partition_barrier()  # ... and every thread knows it, before c_buf is written again or the part counted
    if pending >= 0:
        count_bulk_stored(counters_ptr, done_ptr, pending, 1, PARTS * gl.load(src_tiles_ptr + pending) * tiles_n, epoch,
                          False)
        pending = -1
    c_buf.store(acc.to(c_buf.dtype))
    if by_tma:
        dest = gl.load(srows_ptr + row)
        shared_to_tma()
        if own:
            tma_store(out_desc, [dest + own_shift, col0], c_buf)
        else:
            tma_store(stage_desc, [dest, col0], c_buf)
            pending = pos
    else:
        COLS: gl.constexpr = slice_cols(SUB_M, BN, 32)
        layout: gl.constexpr = slice_layout(SUB_M, COLS)
        partition_barrier()  # every thread's part of the tile in c_buf before any thread reads another's
        r = gl.arange(0, SUB_M, layout=gl.SliceLayout(1, layout))
        ok = r < rows_here
        srow = gl.load(srows_ptr + row + r, mask=ok, other=0)
        if own:
            store_rows(c_buf, out_ptr, srow + own_shift, ok, col0, H, COLS)
        else:
            store_rows(c_buf, stage_ptr, srow, ok, col0, H, COLS)
            count_tile_done(counters_ptr + pos, done_ptr + pos, PARTS * gl.load(src_tiles_ptr + pos) * tiles_n, epoch)
    return pending


@gluon.jit
def _mma_tiles(a_bufs, b_bufs, c_bufs, ready, empty, turn, out_ptr, stage_ptr, srows_ptr, counts_ptr, row_start_ptr,
               tile_start_ptr, recv_off_ptr, src_tiles_ptr, counters_ptr, done_ptr, contig_ptr, epoch, rank, own_row0,
               H, F, G, E, out_rows, stage_rows, group_lo, group_hi, pos_lo, pos_hi,
               WS: gl.constexpr, LOG_G: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
               GROUP_M: gl.constexpr, EXPERT_MAJOR: gl.constexpr, ME: gl.constexpr, B_KMAJOR: gl.constexpr,
               COOP: gl.constexpr):
    """MMA partition ``ME`` (0 or 1). Ping-pong: the CTA's tiles ME, ME + 2, ... (its i-th tile is ring positions
    [i * k_iters, (i + 1) * k_iters)), each main loop in its turn, then its rows stored. Cooperative: rows
    [ME * BM / 2, (ME + 1) * BM / 2) of every tile of the CTA."""
    SUB_M: gl.constexpr = c_bufs.type.shape[1]
    PARTS: gl.constexpr = 2 if COOP else 1
    out_desc = partition_descriptor(out_ptr, out_rows, H, SUB_M, BN)
    stage_desc = partition_descriptor(stage_ptr, stage_rows, H, SUB_M, BN)
    tiles_n = gl.cdiv(H, BN)
    k_iters = gl.cdiv(F, BK)
    first_tile = gl.load(tile_start_ptr + group_lo) * tiles_n
    end_tile = gl.load(tile_start_ptr + group_hi) * tiles_n
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    my_tiles = gl.cdiv(gl.maximum(end_tile - first_tile - pid, 0), nprog)
    if ME == 0:
        if pid == 0:  # this launch's sources with no tile: their segment (zeros) is ready now
            for q in gl.static_range(WS - 1):
                if (q >= pos_lo) & (q < pos_hi):
                    if gl.load(src_tiles_ptr + q) == 0:
                        signal_flag(done_ptr + q, epoch)
    own_shift = own_row0 - gl.load(recv_off_ptr + rank)
    c_buf = c_bufs.index(ME)
    acc = gl.zeros((SUB_M, BN), dtype=gl.float32, layout=acc_layout(BN))
    pending = -1
    if COOP:
        p = 0
        for i in range(my_tiles):
            g, e, pos, pid_n, row, rows_left = _tile(first_tile + pid + i * nprog, tiles_n, tile_start_ptr,
                                                     row_start_ptr, counts_ptr, G, E, LOG_G, BM, WS, EXPERT_MAJOR,
                                                     GROUP_M)
            acc, p = mma_tile(acc, a_bufs, b_bufs, ready, empty, p, k_iters, ME, B_KMAJOR)
            acc = finish_tile(acc, empty, p)
            by_tma = (gl.load(contig_ptr + g) != 0) & (rows_left >= BM)
            pending = _store_part(acc, c_buf, out_desc, stage_desc, out_ptr, stage_ptr, srows_ptr, counters_ptr,
                                  done_ptr, src_tiles_ptr, epoch, row + ME * SUB_M, rows_left - ME * SUB_M, by_tma,
                                  (rank + 1 + pos) % WS == rank, own_shift, pos, pid_n * BN, H, tiles_n, pending,
                                  PARTS)
    else:
        for i in range(ME, my_tiles, 2):
            g, e, pos, pid_n, row, rows_left = _tile(first_tile + pid + i * nprog, tiles_n, tile_start_ptr,
                                                     row_start_ptr, counts_ptr, G, E, LOG_G, BM, WS, EXPERT_MAJOR,
                                                     GROUP_M)
            # partition 0 goes first: on a fresh barrier a wait for the parity before phase 0 passes at once
            mbarrier.wait(turn.index(ME), ((i // 2) & 1) ^ (1 - ME))
            acc, p = mma_tile(acc, a_bufs, b_bufs, ready, empty, i * k_iters, k_iters, 0, B_KMAJOR)
            mbarrier.arrive(turn.index(1 - ME))
            acc = finish_tile(acc, empty, p)
            by_tma = (gl.load(contig_ptr + g) != 0) & (rows_left >= BM)
            pending = _store_part(acc, c_buf, out_desc, stage_desc, out_ptr, stage_ptr, srows_ptr, counters_ptr,
                                  done_ptr, src_tiles_ptr, epoch, row, rows_left, by_tma,
                                  (rank + 1 + pos) % WS == rank, own_shift, pos, pid_n * BN, H, tiles_n, pending,
                                  PARTS)
    tma.store_wait(0)  # no exit while a TMA store still reads this CTA's shared memory; the last one counted
    partition_barrier()
    if pending >= 0:
        count_bulk_stored(counters_ptr, done_ptr, pending, 1, PARTS * gl.load(src_tiles_ptr + pending) * tiles_n, epoch,
                          False)


@gluon.jit(do_not_specialize=["epoch", "own_row0", "group_lo", "group_hi", "pos_lo", "pos_hi"])  # see launcher.py
def down_ws_kernel(
    act_ptr, w_ptr, out_ptr, stage_ptr,
    srows_ptr, counts_ptr, row_start_ptr, tile_start_ptr, recv_off_ptr, src_tiles_ptr,
    counters_ptr, done_ptr, contig_ptr, epoch,
    rank, own_row0, M, H, F, G, E, out_rows, stage_rows, group_lo, group_hi, pos_lo, pos_hi, w_rows,
    WS: gl.constexpr, LOG_G: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
    GROUP_M: gl.constexpr, STAGES: gl.constexpr, EXPERT_MAJOR: gl.constexpr, B_KMAJOR: gl.constexpr,
    COOP: gl.constexpr, MMA_REGS: gl.constexpr, LOAD_REGS: gl.constexpr,
):
    dtype: gl.constexpr = act_ptr.dtype.element_ty
    # cooperative: each MMA partition's half of the rows, its own A box
    a_bufs, b_bufs, c_bufs, ready, empty, turn = allocate_ring(dtype, dtype, STAGES, BM, BN, BK, 2 if COOP else 1,
                                                               B_KMAJOR)
    # (argument tuples written out in place: a tuple held in a variable turns its constexprs into tensors)
    gl.warp_specialize([
        (_mma_tiles, (a_bufs, b_bufs, c_bufs, ready, empty, turn, out_ptr, stage_ptr, srows_ptr, counts_ptr,
                      row_start_ptr, tile_start_ptr, recv_off_ptr, src_tiles_ptr, counters_ptr, done_ptr, contig_ptr,
                      epoch, rank, own_row0, H, F, G, E, out_rows, stage_rows, group_lo, group_hi, pos_lo, pos_hi,
                      WS, LOG_G, BM, BN, BK, GROUP_M, EXPERT_MAJOR, 0, B_KMAJOR, COOP)),
        (_mma_tiles, (a_bufs, b_bufs, c_bufs, ready, empty, turn, out_ptr, stage_ptr, srows_ptr, counts_ptr,
                      row_start_ptr, tile_start_ptr, recv_off_ptr, src_tiles_ptr, counters_ptr, done_ptr, contig_ptr,
                      epoch, rank, own_row0, H, F, G, E, out_rows, stage_rows, group_lo, group_hi, pos_lo, pos_hi,
                      WS, LOG_G, BM, BN, BK, GROUP_M, EXPERT_MAJOR, 1, B_KMAJOR, COOP)),
        (_load_tiles, (act_ptr, w_ptr, a_bufs, b_bufs, ready, empty, tile_start_ptr, row_start_ptr, counts_ptr,
                       M, H, F, G, E, group_lo, group_hi, w_rows, WS, LOG_G, BM, BN, BK, GROUP_M, EXPERT_MAJOR,
                       B_KMAJOR)),
    ], [4, 1], [MMA_REGS, LOAD_REGS])  # the second MMA partition one warpgroup, the loader one warp


STORES = ("ws_pingpong", "ws_coop")


def stacked_rows(w: torch.Tensor) -> int | None:
    """Rows of the 2-D matrix the kernel reads an [E, K, N] expert weight as (E * K, or E * N for a K-major one),
    or None where its experts are not stacked densely (e.g. one half of a fused weight)."""
    E, K, N = w.shape
    stride_e, stride_row, k_major = expert_layout(w)
    inner, width = (N, K) if k_major else (K, N)
    return E * inner if stride_row == width and stride_e == inner * width else None


def unsupported(config, act: torch.Tensor, w_down: torch.Tensor, out: torch.Tensor, stage: torch.Tensor) -> str | None:
    """Why ``launch`` cannot run ``config`` for these tensors (None: it can)."""
    BM, BK, warps, store = config[0], config[2], config[5], config[6]
    why = refusal(store, STORES, warps, act.dtype, BM)
    if why:
        return why
    if out.dtype != act.dtype or stage.dtype != act.dtype:
        return f"outputs of act's dtype {act.dtype} only, not {out.dtype} / {stage.dtype}"
    if not tma_stores(out, stage):
        return "outputs the TMA cannot store into (moe_tiles.tma_stores)"
    if stacked_rows(w_down) is None:
        return f"expert weights not stacked densely (strides {tuple(w_down.stride())})"
    if w_down.shape[1] % BK:
        return f"K={w_down.shape[1]} not a multiple of BK={BK}: a block would reach the next expert's rows"
    if not act.is_contiguous() or act.data_ptr() % 16 or act.shape[1] * act.element_size() % 16:
        return "act must be contiguous with 16-byte aligned rows (TMA loads)"
    return None


def launch(act, w_down, out, stage, plan, counters, done, epoch, rank, ws, own_row0, config, grid, phase=None):
    """``moe_gemm.launch_down``'s contract for a ``ws_pingpong`` / ``ws_coop`` config (see ``unsupported`` for what
    it refuses)."""
    E, F, H = w_down.shape
    BM, BN, BK, GROUP_M, stages, _warps, store = config
    why = unsupported(config, act, w_down, out, stage)
    if why:
        raise ValueError(f"moe_experts' down {store} kernel: {why}")
    G = ws * E
    k_major = expert_layout(w_down)[2]
    launcher.launch(down_ws_kernel, (grid,),
        act, w_down, out, stage, plan["srows"], plan["counts"], plan["row_start"], plan["tile_start"][BM],
        plan["recv_off"], plan["src_tiles"][BM], counters, done, plan["contig"], epoch, rank, own_row0, act.shape[0],
        H, F, G, E, out.shape[0], stage.shape[0], *(phase or (0, G, 0, ws)), stacked_rows(w_down),
        WS=ws, LOG_G=log_groups(G), BM=BM, BN=BN, BK=BK, GROUP_M=GROUP_M, STAGES=stages,
        EXPERT_MAJOR=plan["expert_major"], B_KMAJOR=k_major, COOP=store == "ws_coop", MMA_REGS=MMA_REGS,
        LOAD_REGS=LOAD_REGS, num_warps=WARPS, maxnreg=MAXNREG,
    )
