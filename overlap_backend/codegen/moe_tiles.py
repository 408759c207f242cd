"""Tile maths and operand layouts shared by the MoE expert GEMM kernels (``moe_gemm``'s and the down GEMM's Gluon
form, ``moe_down_ws``): a tile's group, expert, source position and row / column tile in the launch's walk, the
binary-search depth over the groups, the layouts of the expert weights the kernels read in place, and whether the
down GEMM's outputs take TMA stores. See ``moe_gemm``'s docstring for the plan these read."""

import torch
import triton
import triton.language as tl

from .tiles import grouped_tile


@triton.jit
def find_group(rt, tile_start_ptr, G, LOG_G: tl.constexpr):
    """Largest g < G with ``tile_start[g] <= rt`` (``tile_start[0] == 0 <= rt < tile_start[G]``):
    the group of row tile ``rt``; groups without tiles are skipped because their start repeats."""
    lo = rt * 0
    hi = lo + G
    for _ in tl.static_range(LOG_G):
        mid = (lo + hi) // 2
        wide = hi - lo > 1
        up = wide & (tl.load(tile_start_ptr + mid) <= rt)
        lo = tl.where(up, mid, lo)
        hi = tl.where(wide & (up == 0), mid, hi)
    return lo


@triton.jit
def tile_group(t, tiles_n, tile_start_ptr, G, E, LOG_G: tl.constexpr, WS: tl.constexpr, EXPERT_MAJOR: tl.constexpr,
               GROUP_M: tl.constexpr):
    """Tile t -> (group, expert, source position, row tile in the group, column tile).

    Remote-first order (groups ``pos * E + e``): GROUP_M row tiles of one group at a time. Expert-major
    (groups ``e * ws + pos``): GROUP_M row tiles of one *expert* at a time, across its sources' groups, so
    that the tiles reading one column block of its weight run side by side (at decode sizes a group is one
    row tile: walking group by group would read the weight once per wave of CTAs, not once)."""
    g = find_group(t // tiles_n, tile_start_ptr, G, LOG_G)
    if EXPERT_MAJOR:  # groups e * ws + pos
        e = g // WS
        span_first = tl.load(tile_start_ptr + e * WS)
        span_m, pid_n = grouped_tile(t - span_first * tiles_n, tl.load(tile_start_ptr + e * WS + WS) - span_first,
                                     tiles_n, GROUP_M)
        g = find_group(span_first + span_m, tile_start_ptr, G, LOG_G)
        pid_m = span_first + span_m - tl.load(tile_start_ptr + g)
        pos = g % WS
    else:  # groups pos * E + e
        g_first = tl.load(tile_start_ptr + g)
        pid_m, pid_n = grouped_tile(t - g_first * tiles_n, tl.load(tile_start_ptr + g + 1) - g_first, tiles_n, GROUP_M)
        e = g % E
        pos = g // E
    return g, e, pos, pid_m, pid_n


@triton.jit
def span_rows(t, tiles_n, span_start_ptr, row_start_ptr, counts_ptr, srows_ptr, recv_off_ptr, rank, E,
              LOG_E: tl.constexpr, BM: tl.constexpr, WS: tl.constexpr, GROUP_M: tl.constexpr):
    """Tile t of the row tiles that span an expert's sources (expert-major groups ``e * ws + pos``, whose rows are
    consecutive in sorted order; ``span_start``: [E + 1] prefix of each expert's row tiles), GROUP_M row tiles of one
    expert at a time -> (expert, column tile, first sorted row, sorted rows, row mask, received rows, each row's
    source rank, the sources among the tile's rows as a bit mask: bit s for source rank s)."""
    e = find_group(t // tiles_n, span_start_ptr, E, LOG_E)
    span_first = tl.load(span_start_ptr + e)
    pid_m, pid_n = grouped_tile(t - span_first * tiles_n, tl.load(span_start_ptr + e + 1) - span_first, tiles_n,
                                GROUP_M)
    row0 = tl.load(row_start_ptr + e * WS)
    end = tl.load(row_start_ptr + e * WS + WS - 1) + tl.load(counts_ptr + e * WS + WS - 1)
    tile_row = row0 + pid_m * BM
    offs_p = tile_row + tl.arange(0, BM)
    mask = offs_p < end
    srow = tl.load(srows_ptr + offs_p, mask=mask, other=0)
    src = tl.zeros((BM,), dtype=tl.int32)
    for q in tl.static_range(1, WS):  # received rows of source s: recv_off[s] .. recv_off[s + 1]
        src += (srow >= tl.load(recv_off_ptr + q)).to(tl.int32)
    sources = tl.reduce(tl.where(mask, 1 << src, 0), 0, _bit_or)
    return e, pid_n, tile_row, offs_p, mask, srow, src, sources


@triton.jit
def _bit_or(a, b):
    return a | b


def log_groups(groups: int) -> int:
    """Binary-search steps over ``groups`` groups."""
    return max(1, (groups - 1).bit_length() + 1)


def expert_layout(w) -> tuple[int, int, bool]:
    """``(stride_e, stride_row, k_major)`` of an [E, K, N] expert weight the kernels read as it is:
    N contiguous (row-major per expert) or K contiguous (``k_major``: F.linear's layout); the
    runtime passes only such views (``runtime/moe_symm.py: kernel_expert_weight``)."""
    if w.stride(2) == 1:
        return w.stride(0), w.stride(1), False
    assert w.stride(1) == 1, f"expert weight strides {w.stride()}: neither N nor K contiguous"
    return w.stride(0), w.stride(2), True


def tma_stores(out: torch.Tensor, stage: torch.Tensor) -> bool:
    """Whether the down kernel can store into ``out`` and ``stage`` by TMA: 16-bit outputs (a 32-bit tile's
    store buffer would take the kernel past the shared memory an SM has, at (128, 256) tiles), rows of a multiple
    of 16 bytes from 16-byte aligned bases."""
    return all(t.element_size() == 2 and t.is_contiguous() and t.data_ptr() % 16 == 0
               and t.shape[1] * t.element_size() % 16 == 0 for t in (out, stage))
