"""``ag_mm`` consumer: a persistent GEMM over the gathered rows that waits, per chunk, for its data.

Tile order: the local shard's tiles first (read straight from the shard), then chunk rank+1,
rank+2, ... in the order the copy engines deliver them into this rank's receive buffer
(``buf[ws, rows, K]``). Each chunk arrives in *bands* of ``band_rows`` rows (a multiple of every
block height, the same on every rank), each with its own flag ``flags[chunk * nbands + band]``:
before its first tile of a band a CTA waits for that band's flag (acquire, system scope, bounded). The wait sits in the outer (tile) loop, which is not software
pipelined: a pipelined loop could issue the next tile's loads before the wait.
"""

import torch
import triton
import triton.language as tl

from .flags import OP_AG_MM, wait_flag
from .tiles import add_bias, b_descriptor, global_row, grouped_tile, mainloop, store_rows


@triton.jit
def ag_mm_kernel(
    shard_ptr, buf_ptr, b_ptr, bias_ptr, out_ptr,
    flags_ptr, epoch, claim_ptr, report_ptr, timeout_ns,
    rank, rows, run, N, K, band_rows, nbands,
    WS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    B_KMAJOR: tl.constexpr, HAS_BIAS: tl.constexpr,
    PRECISION: tl.constexpr, TIMED: tl.constexpr, TMA_STORE: tl.constexpr,
):
    tiles_m = tl.cdiv(rows, BM)
    tiles_n = tl.cdiv(N, BN)
    tiles_per_chunk = tiles_m * tiles_n
    shard_desc = tl.make_tensor_descriptor(shard_ptr, shape=[rows, K], strides=[K, 1], block_shape=[BM, BK])
    buf_desc = tl.make_tensor_descriptor(buf_ptr, shape=[WS * rows, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = b_descriptor(b_ptr, K, N, BK, BN, B_KMAJOR)
    if TMA_STORE:  # chunks are contiguous blocks of rows and BM divides them: tiles never straddle two
        out_desc = tl.make_tensor_descriptor(out_ptr, shape=[WS * rows, N], strides=[N, 1], block_shape=[BM, BN])
    waited = nbands - 1  # bands are known here up to this (position, band) key: position 0 is local
    for tile in range(tl.program_id(0), WS * tiles_per_chunk, tl.num_programs(0)):
        pos = tile // tiles_per_chunk
        chunk = (rank + pos) % WS
        pid_m, pid_n = grouped_tile(tile % tiles_per_chunk, tiles_m, tiles_n, GROUP_M)
        if pos == 0:
            a_desc = shard_desc
            a_row = pid_m * BM
        else:
            band = (pid_m * BM) // band_rows
            key = pos * nbands + band
            if key > waited:  # a CTA's tiles come in increasing (position, band) order
                flag = chunk * nbands + band
                wait_flag(flags_ptr + flag, epoch, claim_ptr, report_ptr, OP_AG_MM, rank, flag, nbands, timeout_ns,
                          TIMED)
                waited = key
            a_desc = buf_desc
            a_row = chunk * rows + pid_m * BM
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        acc = mainloop(a_desc, a_row, b_desc, pid_n * BN, K, acc, BK, B_KMAJOR, PRECISION)
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        acc = add_bias(acc, bias_ptr, offs_n, N, HAS_BIAS)
        if TMA_STORE:
            out_desc.store([chunk * rows + pid_m * BM, pid_n * BN], acc.to(out_ptr.dtype.element_ty))
        else:
            store_rows(out_ptr, global_row(offs_m, chunk, run, WS), offs_m < rows, offs_n, N, N, acc)


def launch(shard, buf, b, bias, out, flags, epoch, status, timeout_ns, rank, ws, run, band_rows, config, num_sms,
           timed=True):
    """out[G rows, N] = G @ b (+ bias), G = the gathered shards (own: ``shard``, others: ``buf``).

    ``shard``: [rows, K] contiguous; ``buf``: [ws, rows, K] (this rank's receive buffer; slot
    ``rank`` unused); ``b``: [K, N], contiguous or the transpose of a contiguous [N, K];
    ``flags``: ws * nbands int32 flags, flag c * nbands + b >= epoch once band b (rows
    [b * band_rows, (b + 1) * band_rows)) of chunk c is in ``buf``; ``band_rows`` % BM == 0.
    """
    rows, K = shard.shape
    N = b.shape[1]
    BM, BN, BK, GROUP_M, stages, warps, tma_store = config
    assert band_rows % BM == 0, (band_rows, BM)
    GROUP_M = max(1, min(GROUP_M, band_rows // BM))  # a group of row-tiles stays inside one band
    assert not tma_store or (run == rows and rows % BM == 0), (tma_store, run, rows, BM)
    grid = (min(num_sms, ws * triton.cdiv(rows, BM) * triton.cdiv(N, BN)),)
    b_kmajor = b.stride(0) == 1 and b.stride(1) == K
    ag_mm_kernel[grid](
        shard, buf, b.t() if b_kmajor else b, bias if bias is not None else out, out,
        flags, epoch, *status, timeout_ns,
        rank, rows, run, N, K, band_rows, max(1, triton.cdiv(rows, band_rows)),
        WS=ws, BM=BM, BN=BN, BK=BK, GROUP_M=GROUP_M, B_KMAJOR=b_kmajor,
        HAS_BIAS=bias is not None, PRECISION="ieee" if shard.dtype == torch.float32 else None,
        TIMED=timed, TMA_STORE=tma_store, num_stages=stages, num_warps=warps,
    )
    return out
