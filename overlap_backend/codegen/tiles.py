"""Tile maths shared by the GEMM kernels: tile order inside a chunk and across ``ag_mm``'s chunks, the TMA main
loop, row maps.

A *chunk* is the part of a matrix that one rank owns or sends (ws chunks per problem, or per round
for ``mm_ar``). Kernels walk tiles chunk by chunk in the order the data arrives (``ag_mm``) or the
order it must leave (``mm_rs``); inside a chunk, tiles are grouped GROUP_M row-tiles at a time so
that consecutive CTAs reuse the same B columns from L2.

Row maps: a chunk is ``outer`` runs of ``run`` consecutive rows (``run == rows`` when the chunk is
contiguous, e.g. gathered along dim 0; ``run = S/ws`` for ``[B, S, K]`` gathered along S). Local
row ``i`` of chunk ``c`` is global row ``(i // run) * run * ws + c * run + i % run``.
"""

import triton
import triton.language as tl


@triton.jit
def grouped_tile(t, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of the t-th tile of a chunk, GROUP_M row-tiles per group."""
    width = GROUP_M * tiles_n
    first_m = (t // width) * GROUP_M
    size_m = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (t % width) % size_m
    pid_n = (t % width) // size_m
    return pid_m, pid_n


@triton.jit
def global_row(i, chunk, run, ws):
    """Global row of local row ``i`` of ``chunk`` (see the module docstring)."""
    return (i // run) * (run * ws) + chunk * run + i % run


@triton.jit
def column_halves(acc, BM: tl.constexpr, BN: tl.constexpr):
    """The [BM, BN/2] column halves of a [BM, BN] tile (a subtiled epilogue stores one while it computes the other)."""
    return tl.split(tl.permute(tl.reshape(acc, (BM, 2, BN // 2)), (0, 2, 1)))


@triton.jit
def mainloop(a_desc, a_row, b_desc, off_n, K, acc, BK: tl.constexpr, B_KMAJOR: tl.constexpr,
             PRECISION: tl.constexpr):
    """acc += A[a_row : a_row+BM, :] @ B[:, off_n : off_n+BN] over all of K (TMA loads).

    ``B_KMAJOR``: ``b_desc`` describes B^T ([N, K], K contiguous: an ``nn.Linear`` weight as it is
    stored), else B itself ([K, N]).
    """
    for k in range(0, tl.cdiv(K, BK)):
        a = a_desc.load([a_row, k * BK])
        if B_KMAJOR:
            b = b_desc.load([off_n, k * BK]).T
        else:
            b = b_desc.load([k * BK, off_n])
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    return acc


@triton.jit
def b_descriptor(b_ptr, K, N, BK: tl.constexpr, BN: tl.constexpr, B_KMAJOR: tl.constexpr):
    if B_KMAJOR:
        desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    else:
        desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
    return desc


@triton.jit
def add_bias(acc, bias_ptr, offs_n, N, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
        acc = acc + bias.to(tl.float32)[None, :]
    return acc


@triton.jit
def store_rows(ptr, rows, row_mask, offs_n, N, stride, tile):
    """Masked store of a [BM, BN] tile to ``ptr[rows, offs_n]`` (row-major, ``stride`` per row)."""
    mask = row_mask[:, None] & (offs_n < N)[None, :]
    tl.store(ptr + rows.to(tl.int64)[:, None] * stride + offs_n[None, :], tile.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def load_rows(ptr, rows, row_mask, offs_n, N, stride):
    mask = row_mask[:, None] & (offs_n < N)[None, :]
    return tl.load(ptr + rows.to(tl.int64)[:, None] * stride + offs_n[None, :], mask=mask, other=0.0)


@triton.jit
def peer_buffer(table_ptr, peer, offset_bytes, dtype: tl.constexpr):
    """Rank ``peer``'s symmetric data buffer at byte ``offset_bytes`` (a multiple of 16) as a ``dtype`` pointer, from
    the address table ``table_ptr`` (int64 per rank). The bases are cudaMalloc'd (256-byte aligned); the hint lets a
    tile's stores through it go in 16-byte vectors (without it, Triton cannot see the loaded address's alignment and
    stores 2 bytes at a time)."""
    return tl.multiple_of((tl.load(table_ptr + peer) + offset_bytes).to(tl.pointer_type(dtype)), 16)


@triton.jit
def tile_position(tile, tiles_m, tiles_n, WS: tl.constexpr, GROUP_M: tl.constexpr, PEERS_BY_COLUMN: tl.constexpr):
    """(position, pid_m, pid_n) of tile ``tile``: the local shard's tiles first (position 0), then the peers'.
    Chunk by chunk in arrival order; with ``PEERS_BY_COLUMN`` column block by column block, every peer's row
    tiles of one block in turn, so that the weight's block is read from memory once and from L2 by the others
    (chunks of few rows, where each chunk's tiles would read the whole weight)."""
    tiles_per_chunk = tiles_m * tiles_n
    pos = tile // tiles_per_chunk
    pid_m, pid_n = grouped_tile(tile % tiles_per_chunk, tiles_m, tiles_n, GROUP_M)
    if PEERS_BY_COLUMN:
        peer_tile = tl.maximum(tile - tiles_per_chunk, 0)
        per_column = (WS - 1) * tiles_m
        within = peer_tile % per_column
        local = tile < tiles_per_chunk
        pos = tl.where(local, 0, 1 + within // tiles_m)
        pid_m = tl.where(local, pid_m, within % tiles_m)
        pid_n = tl.where(local, pid_n, peer_tile // per_column)
    return pos, pid_m, pid_n
