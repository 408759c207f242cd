"""``moe_experts``'s work list in one single-CTA kernel, instead of ~40 small torch ops.

What it computes is ``runtime/moe_symm.py: plan_reference`` (the definition, and the tests'
reference): grouped row j belongs to expert ``e = #{k: ends[k] <= j}`` and came from source
``s = #{q: recv_off[q + 1] <= rows[j]}``, position ``pos = (s - rank - 1) % ws``; its group is
``pos * E + e`` (``e * ws + pos`` expert-major), or none when ``rows[j] < 0`` or ``e >= E``. The
kernel sorts the rows by group, stably (a counting sort), and derives per group the counts, the
starts, ``contig`` (the group's rows are consecutive received rows) and, per block height, the row
tile prefix sums and the row tiles of each source position (with ``SPAN``, expert-major: those of the tiles that span
an expert's sources too, ``moe_symm.span_tiles``).

Why: on 2xH200 the torch version cost 0.7-1.0 ms of host time per call (bench/probe_moe_gemm.py),
more than the whole GPU time of a decode-size layer. One CTA walks the rows twice in blocks of
BLOCK (``ONEHOT_ELEMENTS // GP``), up to ``knobs.codegen.MOE_PLAN_MAX_ROWS`` rows: counts first, then
each row's place ``row_start[g] + (rows of g before it)``, the rank inside a block from a cumulative
sum over a [BLOCK, GP] one-hot matrix. GP (groups, padded to a
power of two) is bounded by ``MAX_GROUPS``; above it the runtime takes the torch version.
"""

import torch
import triton
import triton.language as tl

from ..spec import knobs
from . import launcher

MAX_GROUPS = 128  # ws * local experts; beyond it the [BLOCK, GP] one-hot matrix would not fit
ONEHOT_ELEMENTS = 8192  # BLOCK * GP: the one-hot matrix's size (registers of 4 warps)


@triton.jit
def _groups_of(rows_ptr, ends_ptr, recv_off_ptr, j, m, rank, E, G,
               WS: tl.constexpr, EP: tl.constexpr, WSP: tl.constexpr, EXPERT_MAJOR: tl.constexpr):
    """(received row, group or G when the row is in no group) of grouped rows ``j`` (a block)."""
    in_range = j < m
    r = tl.load(rows_ptr + j, mask=in_range, other=-1).to(tl.int32)
    ks = tl.arange(0, EP)
    ends = tl.load(ends_ptr + ks, mask=ks < E, other=2147483647).to(tl.int32)
    e = tl.sum((ends[None, :] <= j[:, None]).to(tl.int32), axis=1)
    qs = tl.arange(0, WSP)
    bounds = tl.load(recv_off_ptr + 1 + qs, mask=qs < WS, other=2147483647)
    s = tl.sum((bounds[None, :] <= r[:, None]).to(tl.int32), axis=1)
    pos = (s - rank - 1 + WS) % WS
    if EXPERT_MAJOR:
        g = e * WS + pos
    else:
        g = pos * E + e
    valid = in_range & (r >= 0) & (e < E)
    return r, tl.where(valid, g, G)


@triton.jit(do_not_specialize=["m"])  # the row count changes per call (dropless routing): one compilation
def plan_kernel(rows_ptr, ends_ptr, recv_off_ptr, srows_ptr, counts_ptr, row_start_ptr, contig_ptr,
                tile_start_a_ptr, src_tiles_a_ptr, tile_start_b_ptr, src_tiles_b_ptr,
                span_start_a_ptr, span_src_a_ptr, span_start_b_ptr, span_src_b_ptr,
                m, rank, E, G,
                WS: tl.constexpr, EP: tl.constexpr, WSP: tl.constexpr, GP: tl.constexpr,
                BM_A: tl.constexpr, BM_B: tl.constexpr, EXPERT_MAJOR: tl.constexpr, BLOCK: tl.constexpr,
                SPAN: tl.constexpr = False):
    gs = tl.arange(0, GP)
    # pass 1: rows per group
    counts = tl.zeros((GP,), dtype=tl.int32)
    for start in range(0, m, BLOCK):
        j = start + tl.arange(0, BLOCK)
        r, g = _groups_of(rows_ptr, ends_ptr, recv_off_ptr, j, m, rank, E, G, WS, EP, WSP, EXPERT_MAJOR)
        counts += tl.sum((g[:, None] == gs[None, :]).to(tl.int32), axis=0)
    row_start = tl.cumsum(counts, axis=0) - counts
    # pass 2: each row's place (stable), and per group the spread of (received row - place)
    taken = tl.zeros((GP,), dtype=tl.int32)
    lo = tl.full((GP,), 2147483647, dtype=tl.int32)
    hi = tl.full((GP,), -2147483647, dtype=tl.int32)
    for start in range(0, m, BLOCK):
        j = start + tl.arange(0, BLOCK)
        r, g = _groups_of(rows_ptr, ends_ptr, recv_off_ptr, j, m, rank, E, G, WS, EP, WSP, EXPERT_MAJOR)
        onehot = (g[:, None] == gs[None, :]).to(tl.int32)
        before = tl.cumsum(onehot, axis=0) - onehot  # rows of the same group earlier in this block
        base = row_start + taken
        place = tl.sum(onehot * (base[None, :] + before), axis=1)
        ok = g < G
        tl.store(srows_ptr + place, r, mask=ok)
        step = r - place
        lo = tl.minimum(lo, tl.min(tl.where(onehot != 0, step[:, None], 2147483647), axis=0))
        hi = tl.maximum(hi, tl.max(tl.where(onehot != 0, step[:, None], -2147483647), axis=0))
        taken += tl.sum(onehot, axis=0)
    real = gs < G
    tl.store(counts_ptr + gs, counts, mask=real)
    tl.store(row_start_ptr + gs, row_start, mask=real)
    tl.store(contig_ptr + gs, ((lo == hi) | (counts == 0)).to(tl.int32), mask=real)
    _tiles(counts, gs, G, E, tile_start_a_ptr, src_tiles_a_ptr, WS, WSP, GP, BM_A, EXPERT_MAJOR)
    _tiles(counts, gs, G, E, tile_start_b_ptr, src_tiles_b_ptr, WS, WSP, GP, BM_B, EXPERT_MAJOR)
    if SPAN:  # (expert-major)
        tl.debug_barrier()  # row_start, stored above by every thread, is read back by expert below
        first = row_start - tl.load(row_start_ptr + gs // WS * WS, mask=gs < G, other=0)  # row in its expert
        _span_tiles(counts, first, gs, G, E, span_start_a_ptr, span_src_a_ptr, WS, WSP, GP, EP, BM_A)
        _span_tiles(counts, first, gs, G, E, span_start_b_ptr, span_src_b_ptr, WS, WSP, GP, EP, BM_B)


@triton.jit
def _span_tiles(counts, first, gs, G, E, span_start_ptr, span_src_ptr, WS: tl.constexpr, WSP: tl.constexpr,
                GP: tl.constexpr, EP: tl.constexpr, BM: tl.constexpr):
    """Expert-major row tiles of height BM that span an expert's sources: their prefix over experts ([E + 1]) and per
    source position the tiles holding any of its rows (``moe_symm.span_tiles``). ``first``: each group's first row
    within its expert."""
    es = tl.arange(0, EP)
    in_expert = (gs[:, None] // WS == es[None, :]) & (gs < G)[:, None]
    per_expert = tl.sum(tl.where(in_expert, counts[:, None], 0), axis=0)
    tl.store(span_start_ptr + 1 + es, tl.cumsum((per_expert + BM - 1) // BM, axis=0), mask=es < E)
    tl.store(span_start_ptr + es, tl.zeros((EP,), dtype=tl.int32), mask=es == 0)
    touched = tl.where((counts > 0) & (gs < G), (first + counts - 1) // BM - first // BM + 1, 0)
    ps = tl.arange(0, WSP)
    per = tl.sum(tl.where(gs[:, None] % WS == ps[None, :], touched[:, None], 0), axis=0)
    tl.store(span_src_ptr + ps, per, mask=ps < WS)


@triton.jit
def _tiles(counts, gs, G, E, tile_start_ptr, src_tiles_ptr, WS: tl.constexpr, WSP: tl.constexpr, GP: tl.constexpr,
           BM: tl.constexpr, EXPERT_MAJOR: tl.constexpr):
    """Row tiles of height BM: their prefix over groups ([G + 1]) and their count per source position."""
    tiles = tl.where(gs < G, (counts + BM - 1) // BM, 0)
    tl.store(tile_start_ptr + 1 + gs, tl.cumsum(tiles, axis=0), mask=gs < G)
    tl.store(tile_start_ptr + gs, tl.zeros((GP,), dtype=tl.int32), mask=gs == 0)
    if EXPERT_MAJOR:
        pos = gs % WS
    else:
        pos = gs // E
    ps = tl.arange(0, WSP)
    per = tl.sum(tl.where(pos[:, None] == ps[None, :], tiles[:, None], 0), axis=0)
    tl.store(src_tiles_ptr + ps, per, mask=ps < WS)


def unsupported(m: int, groups: int, block_rows) -> str | None:
    """Why the kernel does not take this plan (None: it does)."""
    if len(set(block_rows)) > 2:
        return f"{len(set(block_rows))} block heights (at most 2)"
    if groups > MAX_GROUPS:
        return f"{groups} groups (at most {MAX_GROUPS})"
    if m > knobs.codegen.MOE_PLAN_MAX_ROWS:
        return f"{m} rows (at most {knobs.codegen.MOE_PLAN_MAX_ROWS}: above, the torch ops are faster on the GPU)"
    return None


def plan(rows: torch.Tensor, ends: torch.Tensor, recv_off: torch.Tensor, rank: int, ws: int, experts: int,
         block_rows, expert_major: bool = False, span: bool = False) -> dict:
    """``moe_symm.plan_reference``'s dict, computed by one launch (``block_rows``: one or two heights)."""
    m, groups = rows.shape[0], ws * experts
    bms = sorted(set(block_rows))
    if why := unsupported(m, groups, bms):
        raise ValueError(f"plan kernel: {why}")
    assert expert_major or not span, "tiles span an expert's sources in the expert-major order only"
    n_ts, n_src, n_span = groups + 1, ws, experts + 1
    # one int32 buffer, sliced: srows | counts | row_start | contig | (tile_start, src_tiles) per height |
    # (span_start, span_src) per height
    buf = torch.empty(m + 3 * groups + 2 * (n_ts + n_src + n_span + n_src), dtype=torch.int32, device=rows.device)
    views, at = [], 0
    for n in (m, groups, groups, groups, n_ts, n_src, n_ts, n_src, n_span, n_src, n_span, n_src):
        views.append(buf[at : at + n])
        at += n
    srows, counts, row_start, contig, ts_a, st_a, ts_b, st_b, sp_a, ss_a, sp_b, ss_b = views
    bm_a, bm_b = bms[0], bms[-1]
    gp = triton.next_power_of_2(groups)
    launcher.launch(plan_kernel, (1,),
        rows, ends, recv_off, srows, counts, row_start, contig, ts_a, st_a, ts_b, st_b, sp_a, ss_a, sp_b, ss_b,
        m, rank, experts, groups,
        WS=ws, EP=triton.next_power_of_2(max(experts, 1)), WSP=triton.next_power_of_2(ws),
        GP=gp, BM_A=bm_a, BM_B=bm_b, EXPERT_MAJOR=expert_major, BLOCK=max(16, ONEHOT_ELEMENTS // gp), SPAN=span,
        num_warps=4,
    )
    return {
        "contig": contig, "srows": srows, "counts": counts, "row_start": row_start, "recv_off": recv_off,
        "expert_major": expert_major,
        "tile_start": {bm_a: ts_a, bm_b: ts_b}, "src_tiles": {bm_a: st_a, bm_b: st_b},
        "span_start": {bm_a: sp_a, bm_b: sp_b} if span else {},
        "span_src": {bm_a: ss_a, bm_b: ss_b} if span else {},
    }
