"""The pieces of a warp-specialized Hopper GEMM in Gluon (``triton.experimental.gluon``, Triton 3.6 and later):
a ring of shared-memory stages that a TMA loader partition fills and MMA warpgroups drain, and the epilogue's
asynchronous TMA store. Two MMA warpgroups either take the tiles in turns (ping-pong: each stage read by one) or
share every tile, each computing half of its rows (cooperative: each stage read by both, its A in two boxes).

Why Gluon: Triton 3.6 does not warp-specialize ``tl.range(warp_specialize=True)`` on Hopper (the attribute stays in
the TTGIR, no partitions; docs/codegen.md), so a ``tl`` kernel's epilogue and its next tile's pipeline fill never
overlap its main loop. Gluon states the partitions itself.

Protocol of the ring (stage ``s`` of ``STAGES``; ``p`` counts every fill of the CTA's ring, in the order the MMA
partitions drain it): the loader waits for ``empty[s]`` (parity of the lap before), arms ``ready[s]`` with the
bytes it will load (expect-tx) and issues the TMA loads; an MMA warpgroup waits for ``ready[s]``, issues its wgmma
and arrives on ``empty`` of the previous stage once ``warpgroup_mma_wait(1)`` showed that stage's wgmma retired
(a stage is free once every partition that reads it arrived).
A fresh mbarrier counts as having completed the phase before phase 0, so the loader's first lap passes at once.
Each MMA partition is one warpgroup: Gluon lowers ``mbarrier.arrive`` to an arrive by the partition's thread 0, and
``wgmma.wait_group`` retires the calling warpgroup's wgmmas only.

Versions: Triton 3.6 names the partition barrier ``thread_barrier``, the TMA copies
``async_copy_global_to_shared`` / ``async_copy_shared_to_global`` and a shared-memory view's retyping
``_reinterpret``; later versions ``barrier``, ``async_load``, ``async_store`` and ``reinterpret`` (the old copy names
then raise). The names are picked here once.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                             warpgroup_mma_wait)

partition_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global

WARPS = 4  # a partition is one warpgroup: the launch's num_warps (its default partition)
# Registers: a kernel on the ring runs 3 warpgroups (the default partition, the second MMA partition, the loader's warp
# padded to a warpgroup), 3 x 128 threads x MAXNREG within the 64K register file; setmaxnreg then gives the loader
# LOAD_REGS and each MMA warpgroup the rest (a 128x128 or 64x256 fp32 accumulator is 128 registers a thread).
MAXNREG = 168
LOAD_REGS = 40
MMA_REGS = (MAXNREG * 3 - LOAD_REGS) // 2 // 8 * 8

if hasattr(gl.shared_memory_descriptor, "reinterpret"):
    @gluon.jit
    def as_pieces(desc, n: gl.constexpr, rows: gl.constexpr, cols: gl.constexpr, layout: gl.constexpr):
        """``desc``'s memory as ``n`` [rows, cols] tiles of its dtype in ``layout``, indexed along a leading dim."""
        return desc.reinterpret(desc.dtype, [n, rows, cols], layout)
else:
    @gluon.jit
    def as_pieces(desc, n: gl.constexpr, rows: gl.constexpr, cols: gl.constexpr, layout: gl.constexpr):
        """``desc``'s memory as ``n`` [rows, cols] tiles of its dtype in ``layout``, indexed along a leading dim."""
        return desc._reinterpret(desc.dtype, [n, rows, cols], layout)


def refusal(store, stores, warps: int, dtype: torch.dtype, block_m: int) -> str | None:
    """Why no kernel on this ring runs a config (None: these allow it): a store field not among the kernel's
    ``stores``, Triton's interpreter, other than 16-bit inputs, other than one warpgroup per partition, row blocks
    whose share of each MMA partition is not a multiple of 64 rows (a warpgroup MMA's M)."""
    from . import launcher

    if store not in stores:
        return f"store field {store!r} is not one of {stores}"
    if launcher.interpreting():
        return "Gluon kernels do not run under Triton's interpreter"
    if dtype not in (torch.bfloat16, torch.float16):
        return f"16-bit inputs only, not {dtype}"
    if warps != WARPS:
        return f"one MMA warpgroup per partition: num_warps {WARPS}, not {warps}"
    return block_rows_refusal(store, block_m)


def block_rows_refusal(store, block_m: int) -> str | None:
    """Why ``store``'s form cannot take ``block_m``-row tiles (None: it can): each MMA partition's rows (half a tile in
    the cooperative form) must be a multiple of a warpgroup MMA's 64."""
    parts = 2 if store == "ws_coop" else 1
    if block_m % (64 * parts):
        return f"BM={block_m}: {block_m / parts:g} rows a partition, not a multiple of a warpgroup MMA's 64"
    return None


def epilogue_values() -> int:
    """Values a thread of a warpgroup takes per piece of a tile in shared memory (``epilogue_in_pieces``):
    ``knobs.codegen.GLUON_EPILOGUE_VALUES``, at least one 16-byte vector."""
    from ..spec import knobs

    return max(8, knobs.codegen.GLUON_EPILOGUE_VALUES)


@gluon.constexpr_function
def smem_layout(block_shape, dtype):
    """The NVMMA shared layout TMA and wgmma both read for a ``block_shape`` tile of ``dtype``."""
    return gl.NVMMASharedLayout.get_default_for(block_shape, dtype)


@gluon.constexpr_function
def acc_layout(BN):
    """The wgmma accumulator of one warpgroup: m64 per 4 warps, n = BN, k = 16."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])


@gluon.jit
def partition_descriptor(ptr, rows, cols, BLOCK_ROWS: gl.constexpr, BLOCK_COLS: gl.constexpr):
    """A TMA descriptor of the row-major [rows, cols] matrix at ``ptr`` in [BLOCK_ROWS, BLOCK_COLS] boxes, made by the
    partition that issues its copies. A device-side descriptor lies in global scratch that the next launch reuses,
    and the TMA unit caches descriptors: only the threads that ran the tensormap acquire fence after writing it may
    use it, and those are the creating partition's. Made in the kernel's preamble and used by another partition, a
    stale descriptor of an earlier launch read other tensors (wrong tiles in the ops, which pass new tensors each
    call, at 2 ranks on one H100)."""
    return strided_descriptor(ptr, rows, cols, cols, BLOCK_ROWS, BLOCK_COLS)


@gluon.jit
def strided_descriptor(ptr, rows, cols, row_stride, BLOCK_ROWS: gl.constexpr, BLOCK_COLS: gl.constexpr):
    """``partition_descriptor`` of a [rows, cols] matrix whose rows lie ``row_stride`` elements apart (a window of
    a wider one)."""
    layout: gl.constexpr = smem_layout([BLOCK_ROWS, BLOCK_COLS], ptr.dtype.element_ty)
    return tma.make_tensor_descriptor(ptr, [rows, cols], [row_stride, 1], [BLOCK_ROWS, BLOCK_COLS], layout)


@gluon.constexpr_function
def b_block(BN, BK, B_KMAJOR):
    """B's [BK, BN] block as stored: [BN, BK] for a K-major B (B^T [N, K], an nn.Linear weight as stored)."""
    return [BN, BK] if B_KMAJOR else [BK, BN]


@gluon.jit
def b_descriptor(b_ptr, N, K, BN: gl.constexpr, BK: gl.constexpr, B_KMAJOR: gl.constexpr):
    """``partition_descriptor`` of B [K, N] in ``b_block`` boxes (``B_KMAJOR``: ``b_ptr`` is B^T, [N, K])."""
    if B_KMAJOR:
        desc = partition_descriptor(b_ptr, N, K, BN, BK)
    else:
        desc = partition_descriptor(b_ptr, K, N, BK, BN)
    return desc


@gluon.jit
def load_stage(a_desc, a_row, b_desc, off_n, k, a_bufs, b_bufs, ready, empty, p, B_KMAJOR: gl.constexpr, b_k0=0):
    """Fill ring position ``p`` with A's rows [a_row, a_row + BM) at column k and B's [BK, BN] block at (b_k0 + k,
    off_n) (``B_KMAJOR``: ``b_desc`` is B^T, [N, K], the block at (off_n, k)); ``b_k0``: the first row of this GEMM's
    B in ``b_desc``, e.g. an expert's in its stacked weights. Waits until the stage's previous contents were consumed.
    A is loaded
    as ``A_SPLIT`` boxes of ``BM / A_SPLIT`` rows (``a_bufs``: ``STAGES * A_SPLIT`` of them), one per MMA partition
    that shares the stage (the cooperative form). Returns ``p + 1``."""
    STAGES: gl.constexpr = b_bufs.type.shape[0]
    A_SPLIT: gl.constexpr = a_bufs.type.shape[0] // STAGES
    SUB_M: gl.constexpr = a_desc.block_type.shape[0]
    s = p % STAGES
    mbarrier.wait(empty.index(s), ((p // STAGES) & 1) ^ 1)
    bar = ready.index(s)
    mbarrier.expect(bar, A_SPLIT * a_desc.block_type.nbytes + b_desc.block_type.nbytes)
    for h in gl.static_range(A_SPLIT):
        tma_load(a_desc, [a_row + h * SUB_M, k], bar, a_bufs.index(s * A_SPLIT + h))
    if B_KMAJOR:
        tma_load(b_desc, [off_n, k], bar, b_bufs.index(s))
    else:
        tma_load(b_desc, [b_k0 + k, off_n], bar, b_bufs.index(s))
    return p + 1


@gluon.jit
def mma_tile(acc, a_bufs, b_bufs, ready, empty, p, k_iters, A_IDX: gl.constexpr, B_KMAJOR: gl.constexpr):
    """Issue the tile's product over ``k_iters`` ring positions from ``p`` on (A: box ``A_IDX`` of each stage), at most
    one wgmma in flight behind the newest, each stage released once its wgmma retired. Returns (acc, p after the tile)
    with the last wgmma possibly still in flight (``finish_tile``): a ping-pong partition hands the turn over before it
    waits for that one."""
    STAGES: gl.constexpr = b_bufs.type.shape[0]
    A_SPLIT: gl.constexpr = a_bufs.type.shape[0] // STAGES
    for ki in range(k_iters):
        s = p % STAGES
        mbarrier.wait(ready.index(s), (p // STAGES) & 1)
        b = b_bufs.index(s)
        if B_KMAJOR:
            b = b.permute((1, 0))
        acc = warpgroup_mma(a_bufs.index(s * A_SPLIT + A_IDX), b, acc, use_acc=ki > 0, is_async=True)
        acc = warpgroup_mma_wait(1, deps=(acc, ))
        mbarrier.arrive(empty.index((p + STAGES - 1) % STAGES), pred=ki > 0)  # the previous chunk's wgmma retired
        p += 1
    return acc, p


@gluon.jit
def finish_tile(acc, empty, p):
    """Retire the tile's last wgmma (ring position ``p - 1``), then release its stage."""
    STAGES: gl.constexpr = empty.type.shape[0]
    acc = warpgroup_mma_wait(0, deps=(acc, ))
    mbarrier.arrive(empty.index((p + STAGES - 1) % STAGES))
    return acc


@gluon.constexpr_function
def slice_cols(rows, BN, values):
    """Columns of a [rows, BN] tile per slice of ``values`` values a thread of a warpgroup (at least one 16-byte
    vector, at most the tile)."""
    return max(8, min(BN, values * WARPS * 32 // rows))


@gluon.constexpr_function
def piece_cols(layout, bitwidth):
    """Columns of a swizzle atom of NVMMA shared ``layout``: a [rows, BN] tile in it lies in memory as BN / piece_cols
    blocks of [rows, piece_cols], one after another, each in the same layout (Triton lays out the atoms' rows before
    the column blocks), so a block of whole atoms is a contiguous [n, piece_cols] tile of its own."""
    return 8 * max(16, layout.swizzle_byte_width) // bitwidth


@gluon.constexpr_function
def piece_rows(rows, cols, values):
    """Rows of a [rows, cols]-column block per piece: ``values`` a thread of a warpgroup, at least the 16 rows
    ``slice_layout`` covers with 64 columns, at most the block."""
    return max(min(16, rows), min(rows, values * WARPS * 32 // cols))


@gluon.constexpr_function
def pieces_layout(layout):
    """``layout`` for the pieces of a tile in it, indexed along a leading dimension."""
    return gl.NVMMASharedLayout(swizzle_byte_width=layout.swizzle_byte_width, element_bitwidth=layout.element_bitwidth,
                                rank=2, transposed=layout.transposed)


@gluon.constexpr_function
def slice_layout(rows, cols):
    """A warpgroup's layout for a [rows, cols] slice of a tile in shared memory: 16 bytes of a row per thread."""
    return gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[32 * 8 // cols, cols // 8],
                            warps_per_cta=[4, 1], order=[1, 0])


@gluon.jit
def store_rows(c_buf, ptr, rows, ok, col0, N, COLS: gl.constexpr):
    """The tile in ``c_buf`` into ``ptr`` ([*, N], row-major) by the threads: at rows ``rows`` (where ``ok``; in
    ``slice_layout``'s rows) and columns from ``col0`` (those below N), ``COLS`` columns at a time. The caller makes
    every thread's part of the tile in ``c_buf`` visible first (``partition_barrier``)."""
    BN: gl.constexpr = c_buf.type.shape[1]
    layout: gl.constexpr = slice_layout(c_buf.type.shape[0], COLS)
    for j in gl.static_range(BN // COLS):
        cols = col0 + j * COLS + gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
        offs = gl.expand_dims(rows.to(gl.int64) * N, 1) + gl.expand_dims(cols, 0)
        mask = gl.expand_dims(ok, 1) & gl.expand_dims(cols < N, 0)
        gl.store(ptr + offs, c_buf.slice(j * COLS, COLS, dim=1).load(layout), mask=mask)


@gluon.jit
def store_tile(acc, out_desc, c_buf, bias_ptr, row0, col0, N, ep0, ep1, ep2, ep3, HAS_BIAS: gl.constexpr,
               EPILOGUE: gl.constexpr, EP_VALUES: gl.constexpr):
    """(+ bias, then ``EPILOGUE``: ``codegen/epilogue.py``'s generated ``tl`` function) -> ``c_buf`` -> TMA store at
    (row0, col0) of the output, not waited for: only the previous store from ``c_buf`` is waited for, before the
    buffer is written again. The tile's rows are the output's rows [row0, row0 + BM), all of them inside it (TMA
    stores: whole tiles of rows).

    ``EP_VALUES`` 0: the epilogue runs on the accumulator's registers. Otherwise the tile goes to ``c_buf`` first and
    the epilogue runs on it in pieces (``epilogue_in_pieces``): on the accumulator's layout a thread holds its 128
    values, the epilogue's temporaries besides, and ptxas spilled up to 1.8 KB a thread (``bias:0,gelu``), which ran
    the fused rows at 1.6x cuBLAS. Only for an output of the GEMM's dtype: a generated epilogue starts by rounding to
    it, which the store to ``c_buf`` then did."""
    BM: gl.constexpr = acc.type.shape[0]
    BN: gl.constexpr = acc.type.shape[1]
    offs_n = col0 + gl.arange(0, BN, layout=gl.SliceLayout(0, acc.type.layout))
    if HAS_BIAS:
        bias = gl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
        acc = acc + gl.expand_dims(bias.to(gl.float32), 0)
    if EP_VALUES == 0:
        rows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, acc.type.layout))
        mask = (gl.expand_dims(rows, 1) >= row0) & (gl.expand_dims(offs_n, 0) < N)
        acc = EPILOGUE(acc, rows, offs_n, mask, N, ep0, ep1, ep2, ep3)
    tma.store_wait(0)  # the thread that issued the last store from c_buf waits for it to have read c_buf ...
    partition_barrier()  # ... and the partition's other threads for that thread before overwriting c_buf
    c_buf.store(acc.to(out_desc.dtype))
    if EP_VALUES > 0:
        epilogue_in_pieces(c_buf, row0, col0, N, ep0, ep1, ep2, ep3, EPILOGUE, EP_VALUES, bias_ptr, 0, 0, 1, False)
    shared_to_tma()
    tma_store(out_desc, [row0, col0], c_buf)


@gluon.jit
def shared_to_tma():
    """Every thread's writes to shared memory made visible to the TMA unit, before a TMA store issued after this
    reads them: each writing thread fences its generic-proxy writes to the async proxy, then the partition
    synchronizes. The other order (barrier, then fences) lets a warp issue its TMA store while another warp's
    fence is still ahead of it (each warp stores a column block every warp wrote): stale values, the likely cause
    of a wrong fused ``ag_mm`` result in the op on one H100."""
    fence_async_shared()
    partition_barrier()


@gluon.jit
def epilogue_in_pieces(c_buf, row0, col0, N, ep0, ep1, ep2, ep3, EPILOGUE: gl.constexpr, EP_VALUES: gl.constexpr,
                       parts_ptr, rank, rows, PARTS: gl.constexpr, AVERAGE: gl.constexpr):
    """The tile in ``c_buf`` (rows [row0, row0 + BM), columns from col0), a piece of ``EP_VALUES`` values a thread
    at a time (``piece_rows`` rows of a ``piece_cols``-column block) in ``slice_layout``: + the same elements of the
    other ``PARTS - 1`` ranks' partials (``parts_ptr``: [PARTS * rows, N], rank p's at rows p * rows + ...;
    ``PARTS`` 1: none), / ``PARTS`` with ``AVERAGE``, then ``EPILOGUE``; back into ``c_buf``, every thread's part of
    it there before (the caller makes it visible to a TMA store after: ``shared_to_tma``). The pieces are a loop,
    not unrolled: unrolled, an epilogue with erf (GELU) made the persistent kernel ~11k instructions (170 KB),
    fetched again on every tile, and both warpgroups stalled on instruction fetch (one H100: 1.28x the plain
    kernel's time)."""
    BM: gl.constexpr = c_buf.type.shape[0]
    BN: gl.constexpr = c_buf.type.shape[1]
    COLS: gl.constexpr = piece_cols(c_buf.type.layout, c_buf.dtype.primitive_bitwidth)
    ROWS: gl.constexpr = piece_rows(BM, COLS, EP_VALUES)
    RUNS: gl.constexpr = BM // ROWS  # pieces per column block
    pieces = as_pieces(c_buf, BN // COLS * RUNS, ROWS, COLS, pieces_layout(c_buf.type.layout))
    layout: gl.constexpr = slice_layout(ROWS, COLS)
    partition_barrier()  # every thread's part of the tile in c_buf before any thread reads another's
    for i in range(BN // COLS * RUNS):
        part = pieces.index(i)
        r = row0 + (i % RUNS) * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
        cols = col0 + (i // RUNS) * COLS + gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
        mask = (gl.expand_dims(r, 1) >= row0) & (gl.expand_dims(cols, 0) < N)
        x = part.load(layout).to(gl.float32)
        for q in gl.static_range(1, PARTS):
            peer = (rank + q) % PARTS
            offs = gl.expand_dims((peer * rows + r).to(gl.int64) * N, 1) + gl.expand_dims(cols, 0)
            # .cg: past L1, which is not coherent with the copy engine's writes (the flags' acquire orders them)
            x += gl.load(parts_ptr + offs, mask=mask, other=0.0, cache_modifier=".cg").to(gl.float32)
        if AVERAGE:
            x = x / PARTS
        x = EPILOGUE(x, r, cols, mask, N, ep0, ep1, ep2, ep3)
        part.store(x.to(c_buf.dtype))


@gluon.jit
def allocate_ring(dtype: gl.constexpr, out_dtype: gl.constexpr, STAGES: gl.constexpr, BM: gl.constexpr,
                  BN: gl.constexpr, BK: gl.constexpr, A_SPLIT: gl.constexpr, B_KMAJOR: gl.constexpr):
    """The ring's shared memory, its barriers initialized (``init_ring``): ``STAGES`` stages of A (``A_SPLIT`` boxes of
    ``BM / A_SPLIT`` rows each: 2 for the cooperative form) and B (``b_block``), a store buffer of ``out_dtype`` for
    each MMA partition, and the ``ready`` / ``empty`` / ``turn`` barriers. Returns (a_bufs, b_bufs, c_bufs, ready,
    empty, turn)."""
    SUB_M: gl.constexpr = BM // A_SPLIT
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES * A_SPLIT, SUB_M, BK], smem_layout([SUB_M, BK], dtype))
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_block(BN, BK, B_KMAJOR),
                                       smem_layout(b_block(BN, BK, B_KMAJOR), dtype))
    c_bufs = gl.allocate_shared_memory(out_dtype, [2, SUB_M, BN], smem_layout([SUB_M, BN], out_dtype))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    init_ring(ready, empty, turn, A_SPLIT)
    return a_bufs, b_bufs, c_bufs, ready, empty, turn


@gluon.jit
def init_ring(ready, empty, turn, READERS: gl.constexpr):
    """Every stage's ``ready`` (the loader's expect-tx arrive + the bytes) and ``empty`` (an arrive of each of the
    ``READERS`` MMA partitions that read the stage) barrier, and the two ping-pong partitions' ``turn`` pair."""
    STAGES: gl.constexpr = ready.type.shape[0]
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=READERS)
    for j in gl.static_range(2):
        mbarrier.init(turn.index(j), count=1)
