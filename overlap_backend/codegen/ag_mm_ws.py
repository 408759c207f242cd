"""``ag_mm`` consumer, warp-specialized (Gluon, Hopper): ``ag_mm_kernel``'s tiles, tile order, band waits and TMA
stores, in three partitions instead of one loop, so that the next tiles' loads run during a tile's epilogue (the
config's store field ``ws_pingpong`` or ``ws_coop``; ``codegen/gluon_ring.py`` has the ring they share).

- The loader (1 warp) walks the CTA's tiles in ``ag_mm``'s order (``tile_position``: the own shard first, then the
  peers' chunks in arrival order or column block by column block), waits for a peer band's flag before the first
  load of that band (``wait_flag``: acquire, system scope, bounded; then ``fence.proxy.async`` so that the TMA loads
  come after it) and fills the ring, running ahead into the next tile while the MMA warpgroups are busy.
- Two MMA warpgroups (each finishes its tiles itself: bias, the generated epilogue, an asynchronous TMA store):
  ``ws_pingpong`` takes the CTA's tiles in turns, as CUTLASS's ping-pong kernel, so that one's main loop runs while
  the other stores; a ``turn`` mbarrier pair keeps their main loops in ring order (a partition must not wait on a
  stage's ``ready`` for lap n while lap n - 1, the other's, is pending, as a parity wait would then pass at once).
  ``ws_coop`` shares every tile, each warpgroup computing half of its rows, as CUTLASS's cooperative kernel: tiles
  twice as large for the same registers per thread, the epilogue covered only by the loader running ahead.

A wait that gives up claims the report as ``ag_mm_kernel``'s does; the loader then loads whatever the buffer holds,
the kernel finishes and the host raises. Only the loader waits: no MMA partition can read a band before the loader
has loaded it after its flag.

The epilogue: bias, then the op's generated epilogue (``codegen/epilogue.py``'s ``tl`` function, called on the
accumulator's layout), then the TMA store. What it does not do (``launch`` raises ``ValueError``; ``ag_mm``'s other
variants do these): chunks whose rows a tile does not divide or that are not contiguous (TMA stores), chunks short
enough for the whole-input kernel, float32.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from ..spec import knobs
from . import launcher
from .epilogue import epilogue_fn
from .flags import OP_AG_MM, fence_proxy_async, wait_flag
from .gluon_ring import (LOAD_REGS, MAXNREG, MMA_REGS, WARPS, acc_layout, allocate_ring, b_descriptor, epilogue_values,
                         finish_tile, load_stage, mma_tile, partition_descriptor, refusal, store_tile)
from .tiles import tile_position



@gluon.jit
def _load_tiles(shard_ptr, buf_ptr, b_ptr, a_bufs, b_bufs, ready, empty, flags_ptr, epoch, claim_ptr, report_ptr,
                timeout_ns, rank, rows, N, K, band_rows, nbands,
                WS: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, GROUP_M: gl.constexpr,
                B_KMAJOR: gl.constexpr, TIMED: gl.constexpr, PEERS_BY_COLUMN: gl.constexpr):
    """The loader partition: every K-chunk of every tile of this CTA, a peer band's flag waited for first. It makes
    its TMA descriptors itself (``gluon_ring.partition_descriptor``)."""
    SUB_M: gl.constexpr = a_bufs.type.shape[1]
    shard_desc = partition_descriptor(shard_ptr, rows, K, SUB_M, BK)
    buf_desc = partition_descriptor(buf_ptr, WS * rows, K, SUB_M, BK)
    b_desc = b_descriptor(b_ptr, N, K, BN, BK, B_KMAJOR)
    tiles_m = gl.cdiv(rows, BM)
    tiles_n = gl.cdiv(N, BN)
    k_iters = gl.cdiv(K, BK)
    waited = nbands - 1  # bands are known here up to this (position, band) key: position 0 is local
    p = 0
    for tile in range(gl.program_id(0), WS * tiles_m * tiles_n, gl.num_programs(0)):
        pos, pid_m, pid_n = tile_position(tile, tiles_m, tiles_n, WS, GROUP_M, PEERS_BY_COLUMN)
        if pos == 0:
            for ki in range(k_iters):
                p = load_stage(shard_desc, pid_m * BM, b_desc, pid_n * BN, ki * BK, a_bufs, b_bufs, ready, empty, p,
                               B_KMAJOR)
        else:
            chunk = (rank + pos) % WS
            band = (pid_m * BM) // band_rows
            key = pos * nbands + band
            # a CTA's tiles come in increasing (position, band) order, except column by column: each checks its flag
            if (key > waited) | PEERS_BY_COLUMN:
                flag = chunk * nbands + band
                wait_flag(flags_ptr + flag, epoch, claim_ptr, report_ptr, OP_AG_MM, rank, flag, nbands, timeout_ns,
                          TIMED)
                fence_proxy_async(False)  # the acquiring wait, then the TMA (async-proxy) loads it guards
                waited = key
            for ki in range(k_iters):
                p = load_stage(buf_desc, chunk * rows + pid_m * BM, b_desc, pid_n * BN, ki * BK, a_bufs, b_bufs, ready,
                               empty, p, B_KMAJOR)


@gluon.jit
def _mma_tiles(a_bufs, b_bufs, c_bufs, ready, empty, turn, out_ptr, bias_ptr, rank, rows, N, K, ep0, ep1, ep2, ep3,
               WS: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, GROUP_M: gl.constexpr,
               ME: gl.constexpr, B_KMAJOR: gl.constexpr, HAS_BIAS: gl.constexpr, PEERS_BY_COLUMN: gl.constexpr,
               COOP: gl.constexpr, EPILOGUE: gl.constexpr, EP_VALUES: gl.constexpr):
    """MMA partition ``ME`` (0 or 1). Ping-pong: the CTA's tiles ME, ME + 2, ... (its i-th tile is ring positions
    [i * k_iters, (i + 1) * k_iters)), each main loop in its turn, then bias and store. Cooperative: rows
    [ME * BM / 2, (ME + 1) * BM / 2) of every tile of the CTA."""
    tiles_m = gl.cdiv(rows, BM)
    tiles_n = gl.cdiv(N, BN)
    k_iters = gl.cdiv(K, BK)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    my_tiles = gl.cdiv(WS * tiles_m * tiles_n - pid, nprog)
    c_buf = c_bufs.index(ME)
    SUB_M: gl.constexpr = c_bufs.type.shape[1]
    out_desc = partition_descriptor(out_ptr, WS * rows, N, SUB_M, BN)
    acc = gl.zeros((SUB_M, BN), dtype=gl.float32, layout=acc_layout(BN))
    if COOP:
        p = 0
        for i in range(my_tiles):
            pos, pid_m, pid_n = tile_position(pid + i * nprog, tiles_m, tiles_n, WS, GROUP_M, PEERS_BY_COLUMN)
            acc, p = mma_tile(acc, a_bufs, b_bufs, ready, empty, p, k_iters, ME, B_KMAJOR)
            acc = finish_tile(acc, empty, p)
            store_tile(acc, out_desc, c_buf, bias_ptr, ((rank + pos) % WS) * rows + pid_m * BM + ME * SUB_M,
                       pid_n * BN, N, ep0, ep1, ep2, ep3, HAS_BIAS, EPILOGUE, EP_VALUES)
    else:
        for i in range(ME, my_tiles, 2):
            pos, pid_m, pid_n = tile_position(pid + i * nprog, tiles_m, tiles_n, WS, GROUP_M, PEERS_BY_COLUMN)
            # partition 0 goes first: on a fresh barrier a wait for the parity before phase 0 passes at once
            mbarrier.wait(turn.index(ME), ((i // 2) & 1) ^ (1 - ME))
            acc, p = mma_tile(acc, a_bufs, b_bufs, ready, empty, i * k_iters, k_iters, 0, B_KMAJOR)
            mbarrier.arrive(turn.index(1 - ME))
            acc = finish_tile(acc, empty, p)
            store_tile(acc, out_desc, c_buf, bias_ptr, ((rank + pos) % WS) * rows + pid_m * BM, pid_n * BN, N,
                       ep0, ep1, ep2, ep3, HAS_BIAS, EPILOGUE, EP_VALUES)
    tma.store_wait(0)  # no exit while a TMA store still reads this CTA's shared memory


@gluon.jit(do_not_specialize=["epoch"])  # per-call values: see launcher.py
def ag_mm_ws_kernel(
    shard_ptr, buf_ptr, b_ptr, bias_ptr, out_ptr,
    flags_ptr, epoch, claim_ptr, report_ptr, timeout_ns,
    rank, rows, N, K, band_rows, nbands, ep0, ep1, ep2, ep3,
    EPILOGUE: gl.constexpr, EP_VALUES: gl.constexpr, WS: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, GROUP_M: gl.constexpr,
    STAGES: gl.constexpr, B_KMAJOR: gl.constexpr, HAS_BIAS: gl.constexpr, TIMED: gl.constexpr,
    PEERS_BY_COLUMN: gl.constexpr, COOP: gl.constexpr, MMA_REGS: gl.constexpr, LOAD_REGS: gl.constexpr,
):
    # cooperative: each MMA partition's half of the rows, its own A box
    a_bufs, b_bufs, c_bufs, ready, empty, turn = allocate_ring(shard_ptr.dtype.element_ty, out_ptr.dtype.element_ty,
                                                               STAGES, BM, BN, BK, 2 if COOP else 1, B_KMAJOR)
    # (argument tuples written out in place: a tuple held in a variable turns its constexprs into tensors)
    gl.warp_specialize([
        (_mma_tiles, (a_bufs, b_bufs, c_bufs, ready, empty, turn, out_ptr, bias_ptr, rank, rows, N, K, ep0, ep1, ep2,
                      ep3, WS, BM, BN, BK, GROUP_M, 0, B_KMAJOR, HAS_BIAS, PEERS_BY_COLUMN, COOP, EPILOGUE,
                      EP_VALUES)),
        (_mma_tiles, (a_bufs, b_bufs, c_bufs, ready, empty, turn, out_ptr, bias_ptr, rank, rows, N, K, ep0, ep1, ep2,
                      ep3, WS, BM, BN, BK, GROUP_M, 1, B_KMAJOR, HAS_BIAS, PEERS_BY_COLUMN, COOP, EPILOGUE,
                      EP_VALUES)),
        (_load_tiles, (shard_ptr, buf_ptr, b_ptr, a_bufs, b_bufs, ready, empty, flags_ptr, epoch, claim_ptr,
                       report_ptr, timeout_ns, rank, rows, N, K, band_rows, nbands, WS, BM, BN, BK, GROUP_M, B_KMAJOR,
                       TIMED, PEERS_BY_COLUMN)),
    ], [4, 1], [MMA_REGS, LOAD_REGS])  # the second MMA partition one warpgroup, the loader one warp


STORES = ("ws_pingpong", "ws_coop")


def epilogue_values_of(epilogue, dtype: torch.dtype, out_dtype: torch.dtype) -> int:
    """Values a thread takes at a time when a generated epilogue runs on the tile in shared memory
    (``gluon_ring.store_tile``); 0: on the accumulator's registers (no epilogue, an output of another dtype than the
    GEMM's, or the knob 0)."""
    if epilogue is None or not knobs.codegen.GLUON_EPILOGUE_VALUES or out_dtype != dtype:
        return 0
    return epilogue_values()


def unsupported(rows: int, run: int, config, dtype: torch.dtype, whole: bool = False) -> str | None:
    """Why ``launch`` cannot run ``config`` for these chunks (None: it can); ``whole``: ``ag_mm`` reads chunks of
    ``rows`` rows as one gathered matrix (``ag_mm.reads_whole``), which this kernel does not do."""
    BM, warps, store = config[0], config[5], config[6]
    why = refusal(store, STORES, warps, dtype, BM)
    if why:
        return why
    if whole:
        return f"chunks of {rows} rows take the whole-input kernel"
    if run != rows or rows % BM:
        return f"TMA stores need contiguous chunks whose rows ({rows}, runs of {run}) BM={BM} divides"
    return None


def launch(shard, buf, b, bias, out, flags, epoch, status, timeout_ns, rank, ws, run, band_rows, config, num_sms,
           timed=True, epilogue=None, ep_ptrs=(), whole=False):
    """``ag_mm.launch``'s contract for a ``ws_pingpong`` / ``ws_coop`` config (see ``unsupported`` for what it
    refuses), the generated ``epilogue`` included."""
    rows, K = shard.shape
    N = b.shape[1]
    BM, BN, BK, GROUP_M, stages, _warps, store = config
    why = unsupported(rows, run, config, shard.dtype, whole)
    if why:
        raise ValueError(f"ag_mm's {store} kernel: {why}")
    if band_rows % BM:
        raise ValueError(f"band_rows {band_rows} is not a multiple of BM {BM}")
    b_kmajor = b.stride(0) == 1 and b.stride(1) == K
    nbands = max(1, launcher.cdiv(rows, band_rows))
    fn, ptrs = epilogue_fn(epilogue, ep_ptrs, shard.dtype, out)
    grid = launcher.Persistent(ws * launcher.cdiv(rows, BM) * launcher.cdiv(N, BN), num_sms, 1)
    launcher.launch(ag_mm_ws_kernel, grid,
        shard, buf, b.t() if b_kmajor else b, bias if bias is not None else out, out,
        flags, epoch, *status, timeout_ns, rank, rows, N, K, band_rows, nbands, *ptrs,
        EPILOGUE=fn, EP_VALUES=epilogue_values_of(epilogue, shard.dtype, out.dtype), WS=ws, BM=BM, BN=BN, BK=BK, GROUP_M=max(1, min(GROUP_M, band_rows // BM)), STAGES=stages, B_KMAJOR=b_kmajor,
        HAS_BIAS=bias is not None, TIMED=timed,
        PEERS_BY_COLUMN=0 < rows <= knobs.codegen.AG_MM_PEERS_BY_COLUMN_ROWS, COOP=store == "ws_coop",
        MMA_REGS=MMA_REGS, LOAD_REGS=LOAD_REGS,
        num_warps=WARPS, maxnreg=MAXNREG,
    )
    return out
