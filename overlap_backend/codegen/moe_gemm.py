"""``moe_experts`` producer: persistent grouped SwiGLU GEMMs over all local experts, one launch each.

Rows: the *plan* (``runtime/moe_symm.py: plan``, torch ops on the device, no host read) sorts the
valid grouped rows by (source position, expert), position ``pos = (source - rank - 1) % ws``: the
rows that go back to rank+1 first, ..., this rank's own rows last ("remote-critical first"). Group
``g = pos * E + e`` holds ``counts[g]`` rows starting at sorted row ``row_start[g]``; ``srows[p]``
is sorted row p's received-row index (``recv_off[s] <= srows[p] < recv_off[s + 1]``).

With ``expert_major`` (small groups: decode sizes) groups are ``g = e * ws + pos`` instead: the
tiles of one expert's sources are neighbours and go GROUP_M row tiles of the expert (across its
sources) at a time, so concurrent CTAs share its weights in L2 (the weight-bandwidth-bound case), and
sources finish later.

A launch covers the groups ``group_lo .. group_hi`` (all by default). In the remote-first order the
runtime launches gate/up then down once per source position (``phases``): the first source's
results are complete, and shipped, after ~1/ws of the expert compute instead of after all of the
gate/up GEMM, so the combine overlaps the remaining (ws-1)/ws.

Tiles: group g has ``cdiv(counts[g], BM)`` row tiles; ``tile_start`` ([G + 1], int32, on the
device) is their prefix sum, so the tile -> (group, row tile, column tile) map is a binary search
on the device: variable (unbacked) group sizes need no host synchronisation. Group g owns tiles
``tile_start[g] * tiles_n ..`` (its row tiles times the column tiles); inside it (expert-major: inside
the expert's groups) they go GROUP_M row tiles at a time (``tiles.grouped_tile``), so the CTAs running
side by side share both their A rows and their weight columns in L2. (Row by row, 132 CTAs walking all
112 column tiles of a Mixtral-like expert would stream its whole 235 MB gate/up weight from HBM once per
~1.2 row tiles.)
CTA i takes tiles i, i + grid, ... (a ``tl.range`` loop): static assignment is
safe here because no tile waits for another GPU's SMs (the gate/up tiles wait only for copy-engine
transfers, the down tiles for nothing), so a CTA that is not resident yet delays but cannot block.

- ``gate_up_kernel``: ``act[p] = silu(X[p] @ w_gate[e]) * (X[p] @ w_up[e])`` (float32 accumulators,
  one rounding to the compute dtype). Weights come through TMA (3-D descriptors over ``[E, H, F]``,
  blocks ``[1, BK, BN]``, or over ``[E, F, H]`` for weights stored as ``F.linear`` reads them), with
  the weight's own strides: the halves of a fused gate/up weight are read in place. X rows are read from the dispatch buffer, where every source's rows sit
  in its slot (this rank's own rows too: a local copy), after a bounded wait on that source's
  arrival flag (once per source and CTA: **a tile waits only for the segment it reads**). A group
  whose rows are consecutive in the slot (``contig``, from the plan: the usual case, senders sort
  their rows by expert) is read through TMA, else gathered with pointer loads.
- ``down_kernel``: ``Y[p] = act[p] @ w_down[e]``, both operands through TMA (``act`` is in sorted
  order, so a row tile is a contiguous block); the epilogue scatters row p to received-row
  position ``srows[p]``: into ``out`` for this rank's own rows, else into the staging buffer
  (``[N_recv, H]``, received-row order); each remote tile is counted per source position and the
  CTA that finishes a source's last tile raises ``done[pos]`` (release). Program 0 raises the done
  flag of sources with no tile at all (nothing to wait for: their staging rows are zeros).
  With ``TMA_STORE`` (the config's store field) a full tile of a group whose rows are consecutive (``contig``)
  is stored by TMA, asynchronously: the store drains during the CTA's next main loop instead of delaying it
  (at DeepSeek-like K = 2048 the pointer-store epilogue is a seventh of a tile's time). A remote tile stored so is
  counted after that next main loop, once its bulk store completed; the other tiles are stored by pointers.
"""

import torch
import triton
import triton.language as tl

from ..spec import knobs
from . import launcher
from .configs import GLUON_STORES
from .flags import (MOE_CAP_FLAG_BASE, OP_MOE, RELEASED_VALUE, STATUS_MISMATCH, claim_and_report, count_bulk_stored,
                    count_tile_done, signal_flag, wait_flag)
from .moe_tiles import expert_layout, log_groups, span_rows, tile_group, tma_stores


@triton.jit
def expert_descriptor(w_ptr, E, K, N, stride_e, stride_row, BK: tl.constexpr, BN: tl.constexpr,
                      K_MAJOR: tl.constexpr):
    """TMA descriptor of an [E, K, N] expert weight whose rows of N are contiguous (``stride_row``
    between rows of K), or with ``K_MAJOR`` whose columns of K are (the transpose of an [E, N, K]
    weight, ``F.linear``'s layout; ``stride_row`` between its rows of N); ``stride_e`` between
    experts. Any such view works, e.g. one half of a fused gate/up weight. Blocks [1, BK, BN]
    ([1, BN, BK] K-major); zeros past K/N: a block never reads the next expert's rows or the other half."""
    # one return: Triton refuses two returns of differently shaped descriptors, even behind a constexpr if
    if K_MAJOR:
        desc = tl.make_tensor_descriptor(w_ptr, shape=[E, N, K], strides=[stride_e, stride_row, 1],
                                         block_shape=[1, BN, BK])
    else:
        desc = tl.make_tensor_descriptor(w_ptr, shape=[E, K, N], strides=[stride_e, stride_row, 1],
                                         block_shape=[1, BK, BN])
    return desc


@triton.jit
def expert_block(desc, e, k0, n0, BK: tl.constexpr, BN: tl.constexpr, K_MAJOR: tl.constexpr):
    """The [BK, BN] block of expert ``e``'s weight at (``k0``, ``n0``) through ``expert_descriptor``."""
    if K_MAJOR:
        return tl.trans(desc.load([e, n0, k0]).reshape([BN, BK]))
    return desc.load([e, k0, n0]).reshape([BK, BN])


@triton.jit
def tile_rows(t, tiles_n, tile_start_ptr, row_start_ptr, counts_ptr, srows_ptr, G, E,
              LOG_G: tl.constexpr, BM: tl.constexpr, WS: tl.constexpr, EXPERT_MAJOR: tl.constexpr,
              GROUP_M: tl.constexpr):
    """Tile t -> (group, expert, source position, column tile, first sorted row, sorted rows, row
    mask, received rows), in ``tile_group``'s order."""
    g, e, pos, pid_m, pid_n = tile_group(t, tiles_n, tile_start_ptr, G, E, LOG_G, WS, EXPERT_MAJOR, GROUP_M)
    group_row = tl.load(row_start_ptr + g)
    tile_row = group_row + pid_m * BM
    offs_p = tile_row + tl.arange(0, BM)
    mask = offs_p < group_row + tl.load(counts_ptr + g)
    srow = tl.load(srows_ptr + offs_p, mask=mask, other=0)
    return g, e, pos, pid_n, tile_row, offs_p, mask, srow


@triton.jit
def walk(tile_start_ptr, tiles_n, group_lo, group_hi, start_group):
    """(first tile, tile count, shift) of a launch over groups ``group_lo .. group_hi`` whose walk
    starts at group ``start_group``'s first tile and wraps around: its i-th tile is
    ``first + (i + shift) % count``."""
    first_tile = tl.load(tile_start_ptr + group_lo) * tiles_n
    n_tiles = tl.load(tile_start_ptr + group_hi) * tiles_n - first_tile
    shift = tl.load(tile_start_ptr + start_group) * tiles_n - first_tile
    return first_tile, n_tiles, shift


@triton.jit(do_not_specialize=["epoch", "group_lo", "group_hi", "start_group"])  # per-call values: see launcher.py
def gate_up_kernel(
    disp_ptr, w_gate_ptr, w_up_ptr, act_ptr,
    srows_ptr, counts_ptr, row_start_ptr, tile_start_ptr, recv_off_ptr, contig_ptr,
    arrived_ptr, caps_ptr, epoch, claim_ptr, report_ptr, timeout_ns,
    rank, cap, H, F, G, E, group_lo, group_hi, start_group,
    wg_stride_e, wg_stride_row, wu_stride_e, wu_stride_row,
    WS: tl.constexpr, LOG_G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    GROUP_M: tl.constexpr, EXPERT_MAJOR: tl.constexpr, TIMED: tl.constexpr,
    WG_K_MAJOR: tl.constexpr, WU_K_MAJOR: tl.constexpr, SPAN: tl.constexpr = False,
):
    tiles_n = tl.cdiv(F, BN)
    first_tile, n_tiles, shift = walk(tile_start_ptr, tiles_n, group_lo, group_hi, start_group)
    x_desc = tl.make_tensor_descriptor(disp_ptr, shape=[WS * cap, H], strides=[H, 1], block_shape=[BM, BK])
    wg_desc = expert_descriptor(w_gate_ptr, E, H, F, wg_stride_e, wg_stride_row, BK, BN, WG_K_MAJOR)
    wu_desc = expert_descriptor(w_up_ptr, E, H, F, wu_stride_e, wu_stride_row, BK, BN, WU_K_MAJOR)
    waited = 0  # bit s: this CTA has seen source s's dispatch flag
    offs_k = tl.arange(0, BK)
    for i in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        tile = first_tile + (i + shift) % n_tiles  # the i-th tile of the walk
        if SPAN:  # rows of several sources of one expert: each source's slot waited for, the rows gathered
            e, pid_n, _, offs_p, mask, srow, src, sources = span_rows(
                tile, tiles_n, tile_start_ptr, row_start_ptr, counts_ptr, srows_ptr, recv_off_ptr, rank, E, LOG_G, BM,
                WS, GROUP_M)
            for q in tl.static_range(WS):  # the tile's sources, in the order they finish (rank + 1 first)
                s = (rank + 1 + q) % WS
                if ((sources >> s) & 1) != 0:
                    waited = _wait_source(s, waited, arrived_ptr, caps_ptr, cap, epoch, claim_ptr, report_ptr, rank,
                                          timeout_ns, TIMED)
            slot_row = src * cap + srow - tl.load(recv_off_ptr + src, mask=mask, other=0)  # row of the dispatch buffer
            by_tma = False
        else:
            g, e, pos, pid_n, _, offs_p, mask, srow = tile_rows(tile, tiles_n, tile_start_ptr, row_start_ptr,
                                                                counts_ptr, srows_ptr, G, E, LOG_G, BM, WS,
                                                                EXPERT_MAJOR, GROUP_M)
            src = (rank + 1 + pos) % WS
            waited = _wait_source(src, waited, arrived_ptr, caps_ptr, cap, epoch, claim_ptr, report_ptr, rank,
                                  timeout_ns, TIMED)
            slot_row = src * cap + srow - tl.load(recv_off_ptr + src)  # row of the dispatch buffer
            by_tma = tl.load(contig_ptr + g) != 0
        acc_g = tl.zeros((BM, BN), dtype=tl.float32)
        acc_u = tl.zeros((BM, BN), dtype=tl.float32)
        if by_tma:
            # the group's rows are consecutive in the slot (the usual case: senders sort by expert):
            # TMA; rows past the group's end are computed and not stored
            first = tl.min(tl.where(mask, slot_row, WS * cap), axis=0)
            for k in range(0, tl.cdiv(H, BK)):
                a = x_desc.load([first, k * BK]).to(w_gate_ptr.dtype.element_ty)
                bg = expert_block(wg_desc, e, k * BK, pid_n * BN, BK, BN, WG_K_MAJOR)
                bu = expert_block(wu_desc, e, k * BK, pid_n * BN, BK, BN, WU_K_MAJOR)
                acc_g = tl.dot(a, bg, acc_g)
                acc_u = tl.dot(a, bu, acc_u)
        else:
            a_ptrs = disp_ptr + slot_row.to(tl.int64)[:, None] * H + offs_k[None, :]
            for k in range(0, tl.cdiv(H, BK)):
                k_ok = offs_k < H - k * BK
                a = tl.load(a_ptrs, mask=mask[:, None] & k_ok[None, :], other=0.0).to(w_gate_ptr.dtype.element_ty)
                bg = expert_block(wg_desc, e, k * BK, pid_n * BN, BK, BN, WG_K_MAJOR)
                bu = expert_block(wu_desc, e, k * BK, pid_n * BN, BK, BN, WU_K_MAJOR)
                acc_g = tl.dot(a, bg, acc_g)
                acc_u = tl.dot(a, bu, acc_u)
                a_ptrs += BK
        act = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
        offs_n = pid_n * BN + tl.arange(0, BN)
        out_ptrs = act_ptr + offs_p.to(tl.int64)[:, None] * F + offs_n[None, :]
        tl.store(out_ptrs, act.to(act_ptr.dtype.element_ty), mask=mask[:, None] & (offs_n < F)[None, :])


@triton.jit
def _wait_source(src, waited, arrived_ptr, caps_ptr, cap, epoch, claim_ptr, report_ptr, rank, timeout_ns,
                 TIMED: tl.constexpr):
    """Before a CTA's first tile that reads source ``src``'s dispatch slot: wait for its arrival flag and check its
    slot stride. ``waited``: bit s set once source s was seen by this CTA; returned updated."""
    if ((waited >> src) & 1) == 0:
        wait_flag(arrived_ptr + src, epoch, claim_ptr, report_ptr, OP_MOE, rank, src, 1, timeout_ns, TIMED)
        waited = waited | (1 << src)
        if (src != rank) & (epoch != 0):  # the source's slot stride: its rows of x, written before its
            # dispatch flag (epoch 0: the tuning runs, nothing communicated)
            sent = tl.load(caps_ptr + src, volatile=True)
            if (sent != cap) & (sent != RELEASED_VALUE):  # (released: the watchdog's message says why)
                claim_and_report(claim_ptr, report_ptr, STATUS_MISMATCH, OP_MOE, rank, src + MOE_CAP_FLAG_BASE,
                                 sent, cap, 1)
    return waited


@triton.jit(do_not_specialize=["epoch", "own_row0", "group_lo", "group_hi", "pos_lo", "pos_hi"])  # per-call values: see launcher.py
def down_kernel(
    act_ptr, w_down_ptr, out_ptr, stage_ptr,
    srows_ptr, counts_ptr, row_start_ptr, tile_start_ptr, recv_off_ptr, src_tiles_ptr,
    counters_ptr, done_ptr, contig_ptr, epoch,
    rank, own_row0, M, H, F, G, E, out_rows, stage_rows, group_lo, group_hi, pos_lo, pos_hi, wd_stride_e,
    wd_stride_row,
    WS: tl.constexpr, LOG_G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    GROUP_M: tl.constexpr, EXPERT_MAJOR: tl.constexpr, WD_K_MAJOR: tl.constexpr, TMA_STORE: tl.constexpr = False,
    INTERPRET: tl.constexpr = False, SPAN: tl.constexpr = False,
):
    tiles_n = tl.cdiv(H, BN)
    first_tile = tl.load(tile_start_ptr + group_lo) * tiles_n
    end_tile = tl.load(tile_start_ptr + group_hi) * tiles_n
    a_desc = tl.make_tensor_descriptor(act_ptr, shape=[M, F], strides=[F, 1], block_shape=[BM, BK])
    w_desc = expert_descriptor(w_down_ptr, E, F, H, wd_stride_e, wd_stride_row, BK, BN, WD_K_MAJOR)
    if TMA_STORE:  # full tiles of a group whose rows are consecutive: stored by TMA (see _store_tile)
        out_desc = tl.make_tensor_descriptor(out_ptr, shape=[out_rows, H], strides=[H, 1], block_shape=[BM, BN])
        stage_desc = tl.make_tensor_descriptor(stage_ptr, shape=[stage_rows, H], strides=[H, 1], block_shape=[BM, BN])
    else:  # stand-ins, never used
        out_desc = a_desc
        stage_desc = a_desc
    pending = -1  # TMA_STORE: the source position of this CTA's last remote tile stored by TMA, not yet counted
    if tl.program_id(0) == 0:  # this launch's sources with no tile: their segment (zeros) is ready now
        for p in tl.static_range(WS - 1):
            if (p >= pos_lo) & (p < pos_hi):
                if tl.load(src_tiles_ptr + p) == 0:
                    signal_flag(done_ptr + p, epoch)
    for tile in tl.range(first_tile + tl.program_id(0), end_tile, tl.num_programs(0)):
        if SPAN:  # rows of several sources of one expert (consecutive in act): each row to its source
            e, pid_n, first, offs_p, mask, srow, src, sources = span_rows(
                tile, tiles_n, tile_start_ptr, row_start_ptr, counts_ptr, srows_ptr, recv_off_ptr, rank, E, LOG_G, BM,
                WS, GROUP_M)
        else:
            g, e, pos, pid_n, first, offs_p, mask, srow = tile_rows(tile, tiles_n, tile_start_ptr, row_start_ptr,
                                                                    counts_ptr, srows_ptr, G, E, LOG_G, BM, WS,
                                                                    EXPERT_MAJOR, GROUP_M)
        offs_n = pid_n * BN + tl.arange(0, BN)
        n_ok = offs_n < H
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, tl.cdiv(F, BK)):
            # rows past this group's end belong to the next group (or are TMA's zeros): computed, never stored
            a = a_desc.load([first, k * BK])
            b = expert_block(w_desc, e, k * BK, pid_n * BN, BK, BN, WD_K_MAJOR)
            acc = tl.dot(a, b, acc)
        if TMA_STORE:
            if pending >= 0:  # the previous tile's bulk store had this main loop to drain: count it now
                count_bulk_stored(counters_ptr, done_ptr, pending, 1, tl.load(src_tiles_ptr + pending) * tiles_n, epoch,
                                  INTERPRET)
                pending = -1
        y = acc.to(w_down_ptr.dtype.element_ty)  # Y is computed in the compute dtype, then cast
        if SPAN:
            _span_epilogue(y, out_ptr, stage_ptr, counters_ptr, done_ptr, src_tiles_ptr, recv_off_ptr, srow, src,
                           mask[:, None] & n_ok[None, :], offs_n, sources, rank, own_row0, H, tiles_n, epoch,
                           WS)
        else:
            src = (rank + 1 + pos) % WS
            smask = mask[:, None] & n_ok[None, :]
            # a full tile of consecutive rows: one TMA store (TMA_STORE)
            by_tma = (tl.load(contig_ptr + g) != 0) & (tl.sum(mask.to(tl.int32), axis=0) == BM)
            if src == rank:
                local = own_row0 + srow - tl.load(recv_off_ptr + rank)
                _store_tile(out_desc, out_ptr, local, pid_n * BN, offs_n, smask, y, by_tma, H, TMA_STORE)
            else:
                _store_tile(stage_desc, stage_ptr, srow, pid_n * BN, offs_n, smask, y, by_tma, H, TMA_STORE)
                if TMA_STORE:
                    if by_tma:  # counted once its bulk store completed: after the next main loop, or below
                        pending = pos
                    else:
                        count_tile_done(counters_ptr + pos, done_ptr + pos, tl.load(src_tiles_ptr + pos) * tiles_n, epoch)
                else:
                    count_tile_done(counters_ptr + pos, done_ptr + pos, tl.load(src_tiles_ptr + pos) * tiles_n, epoch)
    if TMA_STORE:
        if pending >= 0:
            count_bulk_stored(counters_ptr, done_ptr, pending, 1, tl.load(src_tiles_ptr + pending) * tiles_n, epoch,
                              INTERPRET)


@triton.jit
def _span_epilogue(y, out_ptr, stage_ptr, counters_ptr, done_ptr, src_tiles_ptr, recv_off_ptr, srow, src, mask, offs_n,
                   sources, rank, own_row0, H, tiles_n, epoch, WS: tl.constexpr):
    """A down tile whose rows span sources: the own rows into ``out``, the others into the staging buffer (pointer
    stores), then the tile counted for each remote source among its rows (``sources``: bit s for source rank s)."""
    own = (src == rank)[:, None]
    local = own_row0 + srow - tl.load(recv_off_ptr + rank)
    tl.store(out_ptr + local.to(tl.int64)[:, None] * H + offs_n[None, :], y.to(out_ptr.dtype.element_ty),
             mask=mask & own)
    tl.store(stage_ptr + srow.to(tl.int64)[:, None] * H + offs_n[None, :], y.to(stage_ptr.dtype.element_ty),
             mask=mask & (own == 0))
    for q in tl.static_range(WS - 1):  # position q: source rank + 1 + q (WS - 1: this rank's own rows)
        if ((sources >> ((rank + 1 + q) % WS)) & 1) != 0:
            count_tile_done(counters_ptr + q, done_ptr + q, tl.load(src_tiles_ptr + q) * tiles_n, epoch)


@triton.jit
def _store_tile(desc, ptr, rows, col0, offs_n, mask, y, by_tma, H, TMA_STORE: tl.constexpr):
    """Tile ``y`` into ``ptr[rows, offs_n]``: one TMA store at row ``rows[0]`` where ``by_tma`` (``TMA_STORE``
    only: ``desc`` is a stand-in otherwise), else masked pointer stores."""
    if TMA_STORE:
        if by_tma:
            desc.store([tl.min(rows, axis=0), col0], y.to(ptr.dtype.element_ty))
        else:
            tl.store(ptr + rows.to(tl.int64)[:, None] * H + offs_n[None, :], y.to(ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(ptr + rows.to(tl.int64)[:, None] * H + offs_n[None, :], y.to(ptr.dtype.element_ty), mask=mask)


def phases(ws: int, experts: int, expert_major: bool, own_first: float = 0.0) -> list[tuple[int, int, int, int]]:
    """(first group, end group, first source position, end position) of each launch pair.

    ``own_first`` > 0 (remote-first order only): that fraction of this rank's own experts runs
    first, while the dispatch of the remote rows is still in flight, the rest last (under the
    combine), instead of the first remote tiles waiting for the dispatch."""
    if expert_major:
        return [(0, ws * experts, 0, ws)]
    remote_first = [(p * experts, (p + 1) * experts, p, p + 1) for p in range(ws)]
    k = min(experts - 1, round(experts * own_first))
    if ws == 1 or k <= 0:
        return remote_first
    own = (ws - 1) * experts
    return [(own, own + k, ws - 1, ws)] + remote_first[:-1] + [(own + k, own + experts, ws - 1, ws)]


def launch_gate_up(disp, w_gate, w_up, act, plan, arrived, caps, epoch, status, timeout_ns, rank, ws, cap, config, grid,
                   timed=True, phase=None, start_group=None):
    """``plan``: dict with srows, counts, row_start, recv_off, contig and ``tile_start`` of this BM
    (see runtime/moe_symm.py). ``disp``: [ws * cap, H] dispatch buffer (x dtype; slot s holds
    source s's rows, this rank's own included); ``act`` [M, F]; ``caps`` [ws]: each source's row count
    of x (``symm_layout.MOE_CAP``), which must be ``cap``, this rank's (a mismatch is reported). ``start_group`` (in the phase's
    groups; default its first): the tiles are walked from this group's first one, wrapping around
    to the phase's first group: e.g. the own groups first, whose rows need no transfer, while the
    peers' dispatch is in flight."""
    E, H, F = w_gate.shape
    BM, BN, BK, GROUP_M, stages, warps, _ = config
    G = ws * E
    lo, hi = (phase or (0, G, 0, ws))[:2]
    start = lo if start_group is None else start_group
    assert lo <= start <= hi, (lo, start, hi)
    span = spans_sources(plan)
    if span:  # the walk over the experts' tiles (expert-major: one launch of every group)
        assert (lo, hi, start) == (0, G, 0), (lo, hi, start)
        hi = E
    (ge, gr, gk), (ue, ur, uk) = expert_layout(w_gate), expert_layout(w_up)
    launcher.launch(gate_up_kernel, (grid,),
        disp, w_gate, w_up, act, plan["srows"], plan["counts"], plan["row_start"],
        plan["span_start" if span else "tile_start"][BM],
        plan["recv_off"], plan["contig"], arrived, caps, epoch, *status, timeout_ns, rank, cap, H, F, G, E, lo, hi, start,
        ge, gr, ue, ur,
        WS=ws, LOG_G=log_groups(G), BM=BM, BN=BN, BK=BK, GROUP_M=GROUP_M, EXPERT_MAJOR=plan["expert_major"], TIMED=timed,
        WG_K_MAJOR=gk, WU_K_MAJOR=uk, SPAN=span, num_stages=stages, num_warps=warps,
    )


def spans_sources(plan: dict) -> bool:
    """Whether the Triton expert kernels' row tiles span an expert's sources on this plan: the plan has their tiles
    (``moe_symm.plan``: expert-major with ``knobs.moe.SPAN_SOURCES``; ``moe_symm.span_tiles``)."""
    return bool(plan["span_start"])


def launch_down(act, w_down, out, stage, plan, counters, done, epoch, rank, ws, own_row0, config, grid, phase=None):
    """``out`` [N_send, H] (own rows land at ``own_row0 + i``), ``stage`` [N_recv, H] (remote rows).
    ``phase``: (first group, end group, first source position, end position) of this launch
    (default: all). ``config``'s store field: TMA stores of full tiles (True) or none, or the name of a
    warp-specialized form (``codegen/moe_down_ws.py``)."""
    E, F, H = w_down.shape
    BM, BN, BK, GROUP_M, stages, warps, store = config
    if store in GLUON_STORES:  # a warp-specialized Gluon form (Hopper; imported only where it runs)
        from . import moe_down_ws

        return moe_down_ws.launch(act, w_down, out, stage, plan, counters, done, epoch, rank, ws, own_row0, config,
                                  grid, phase)
    G = ws * E
    lo, hi, pos_lo, pos_hi = phase or (0, G, 0, ws)
    span = spans_sources(plan)
    if span:  # the walk over the experts' tiles (expert-major: one launch of every group)
        assert (lo, hi, pos_lo, pos_hi) == (0, G, 0, ws), phase
        hi = E
    de, dr, dk = expert_layout(w_down)
    launcher.launch(down_kernel, (grid,),
        act, w_down, out, stage, plan["srows"], plan["counts"], plan["row_start"],
        plan["span_start" if span else "tile_start"][BM],
        plan["recv_off"], plan["span_src" if span else "src_tiles"][BM], counters, done, plan["contig"], epoch, rank,
        own_row0, act.shape[0], H, F, G, E, out.shape[0], stage.shape[0], lo, hi, pos_lo, pos_hi, de, dr,
        WS=ws, LOG_G=log_groups(G), BM=BM, BN=BN, BK=BK, GROUP_M=GROUP_M, EXPERT_MAJOR=plan["expert_major"],
        WD_K_MAJOR=dk, TMA_STORE=bool(store) and tma_stores(out, stage) and not span,
        INTERPRET=launcher.interpreting(), SPAN=span, num_stages=stages, num_warps=warps,
    )


def down_unsupported(config, act, w_down, out, stage) -> str | None:
    """Why ``launch_down`` cannot run ``config`` on these tensors (None: it can): only a Gluon form refuses some."""
    if config[6] not in GLUON_STORES:
        return None
    from . import moe_down_ws

    return moe_down_ws.unsupported(config, act, w_down, out, stage)


def candidates(dtype: torch.dtype, kernel: str = "gate_up", measured: tuple | None = None) -> list:
    """Block configs to tune ``kernel`` ("gate_up" or "down") over, for a 16-bit compute ``dtype``:
    (BM, BN, BK, GROUP_M, stages, warps, store: the down kernel's TMA stores, or its Gluon form's name;
    unused by gate/up), ``knobs.codegen.MOE_GATE_UP_16BIT`` / ``MOE_DOWN_16BIT``; ``measured``
    (``spec.kernel_ratios.measured_variant``): one more, the kernel benchmark's fastest variant near the shape."""
    if kernel not in ("gate_up", "down"):
        raise ValueError(f"kernel must be 'gate_up' or 'down', not {kernel!r}")
    cands = list(knobs.codegen.MOE_GATE_UP_16BIT if kernel == "gate_up" else knobs.codegen.MOE_DOWN_16BIT)
    if measured is not None and tuple(measured) not in cands:
        cands.append(tuple(measured))
    return cands
