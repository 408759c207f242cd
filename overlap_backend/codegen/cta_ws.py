"""CTA-pipelining stage 0, warp-specialized (Gluon, Hopper): ``cta.stage0_kernel``'s tiles, tile order, chunk-major
staged blocks, tail and chunk counting, in three partitions instead of one loop, so that a tile's epilogue (the
activation, its stores) runs while the next tiles' loads and, in ping-pong, the other warpgroup's main loop go on
(``knobs.cta.STAGE0_FORM``: ``ws_pingpong`` or ``ws_coop``; ``codegen/gluon_ring.py`` has the ring). At prefill sizes
the ``tl`` kernel's GELU epilogue, which no main loop overlaps, keeps it 4-12 % above cuBLAS + ``F.gelu``.

- The loader (1 warp) walks the CTA's tiles in ``grouped_tile`` order and fills the ring with x's rows and the
  window of W1 (rows ``ldw`` apart) through TMA.
- Two MMA warpgroups take the tiles in turns (``ws_pingpong``) or share each tile, each half its rows
  (``ws_coop``). Each rounds its accumulator into its store buffer and runs ``+ b1`` and the activation on pieces of
  it there (the generated epilogue, ``gluon_ring.epilogue_in_pieces``: on the accumulator's registers bias + GELU
  spilled in ``ag_mm``'s Gluon kernel), then stores a shipped tile into its K-chunk's block of the staging buffer by
  one TMA store and a tail tile into ``keep`` by the threads. A shipped part is counted (``cta_flags.count_chunk_tile``,
  a tile in as many pieces as warpgroups share it) once its store completed: at the warpgroup's next epilogue,
  which waits for that store anyway, or at once for the first row group (``COUNT_FIRST_AT_ONCE``: what stage 1
  waits for first). Counting never waits for anything, so the deferred count cannot deadlock.

Numerics: the generated epilogue rounds the accumulator to the compute dtype, adds ``b1`` and rounds, then the
activation, as the unfused graph computes it (``stage0_kernel`` adds ``b1`` to the float32 accumulator and rounds
once, after the activation).

What it does not do (``launch`` raises ``ValueError``; ``stage0_kernel`` does these): SwiGLU (two accumulators), the
peer transport (stores into the consumers' buffers), split-K runs, half-width last tiles, float32.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from . import epilogue as generated
from . import launcher
from .cta_flags import count_chunk_tile
from .flags import OP_CTA_STAGE0, READY_FLAG_BASE, bulk_stores_done, wait_flag
from .gluon_ring import (LOAD_REGS, MAXNREG, MMA_REGS, WARPS, acc_layout, allocate_ring, epilogue_in_pieces,
                         epilogue_values, finish_tile, load_stage, mma_tile, partition_barrier, partition_descriptor,
                         refusal, shared_to_tma, slice_cols, slice_layout, store_rows, strided_descriptor, tma_store)
from .tiles import grouped_tile


@gluon.jit
def _load_tiles(x_ptr, w1_ptr, a_bufs, b_bufs, ready, empty, M, H, Fp, ldw,
                BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, GROUP_M: gl.constexpr):
    """The loader partition: every K-step of every tile of this CTA. It makes its TMA descriptors itself
    (``gluon_ring.partition_descriptor``)."""
    SUB_M: gl.constexpr = a_bufs.type.shape[1]
    x_desc = partition_descriptor(x_ptr, M, H, SUB_M, BK)
    w_desc = strided_descriptor(w1_ptr, H, Fp, ldw, BK, BN)
    tiles_m = gl.cdiv(M, BM)
    tiles_n = gl.cdiv(Fp, BN)
    p = 0
    for tile in range(gl.program_id(0), tiles_m * tiles_n, gl.num_programs(0)):
        pid_m, pid_n = grouped_tile(tile, tiles_m, tiles_n, GROUP_M)
        for ki in range(gl.cdiv(H, BK)):
            p = load_stage(x_desc, pid_m * BM, w_desc, pid_n * BN, ki * BK, a_bufs, b_bufs, ready, empty, p, False)


@gluon.jit
def _count(counters_ptr, done_ptr, epoch, pid_m, pid_n, tiles_m, tiles_n, tiles_ship, tail_group, kchunk, nch,
           PARTS: gl.constexpr, BN: gl.constexpr, GROUP_M: gl.constexpr):
    """A shipped part, once its TMA store completed: counted (``cta_flags.count_chunk_tile``, staged: the local done flag
    of its (row group, K-chunk), which the copy engine waits for)."""
    bulk_stores_done(False)
    count_chunk_tile(counters_ptr, done_ptr, counters_ptr, 0, epoch, pid_m, pid_n, tiles_m, tiles_n, tiles_ship,
                      tail_group, kchunk // BN, nch, 0, 0, PARTS, 1, GROUP_M, True)


@gluon.jit
def _keep_rows(c_buf, keep_ptr, row0, col0, M, Fp, Fship, m0):
    """A tail tile's rows (from ``row0``) in ``c_buf`` into ``keep`` ``[Mp - m0, Fp - Fship]`` by the threads."""
    ROWS: gl.constexpr = c_buf.type.shape[0]
    COLS: gl.constexpr = slice_cols(ROWS, c_buf.type.shape[1], 32)
    partition_barrier()  # every thread's part of the tile in c_buf before any thread reads another's
    r = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, slice_layout(ROWS, COLS)))
    store_rows(c_buf, keep_ptr, r - m0, r < M, col0 - Fship, Fp - Fship, COLS)


@gluon.jit
def _finish_part(acc, c_buf, stage_desc, keep_ptr, counters_ptr, done_ptr, epoch, pid_m, pid_n, row0, M, Mp, Fp,
                 Fship, tiles_m, tiles_n, tiles_ship, tail_group, m0, kchunk, nch, pend_m, pend_n, ep0, ep1, ep2, ep3,
                 EPILOGUE: gl.constexpr, EP_VALUES: gl.constexpr, PARTS: gl.constexpr, BN: gl.constexpr,
                 GROUP_M: gl.constexpr, COUNT_FIRST_AT_ONCE: gl.constexpr):
    """This warpgroup's rows (from ``row0``) of tile (pid_m, pid_n): the part stored before counted (``pend_m``: its
    row block, -1: none), then this one's epilogue and store. Returns the new (pend_m, pend_n)."""
    tma.store_wait(0)  # the last TMA store from c_buf read it (its completion: bulk_stores_done in _count)
    partition_barrier()  # ... before any thread writes c_buf again
    if pend_m >= 0:
        _count(counters_ptr, done_ptr, epoch, pend_m, pend_n, tiles_m, tiles_n, tiles_ship, tail_group, kchunk, nch,
               PARTS, BN, GROUP_M)
        pend_m = -1
    c_buf.store(acc.to(c_buf.dtype))
    epilogue_in_pieces(c_buf, row0, pid_n * BN, Fp, ep0, ep1, ep2, ep3, EPILOGUE, EP_VALUES, keep_ptr, 0, 0, 1, False)
    if (pid_m // GROUP_M == tail_group) & (pid_n >= tiles_ship):  # the tail: kept here, not counted
        _keep_rows(c_buf, keep_ptr, row0, pid_n * BN, M, Fp, Fship, m0)
    else:
        j = (pid_n * BN) // kchunk  # a tile never straddles two chunks (kchunk % BN == 0)
        shared_to_tma()
        tma_store(stage_desc, [j * Mp + row0, pid_n * BN - j * kchunk], c_buf)
        if COUNT_FIRST_AT_ONCE & (pid_m < GROUP_M):
            _count(counters_ptr, done_ptr, epoch, pid_m, pid_n, tiles_m, tiles_n, tiles_ship, tail_group, kchunk, nch,
                   PARTS, BN, GROUP_M)
        else:
            pend_m = pid_m
            pend_n = pid_n
    return pend_m, pend_n


@gluon.jit
def _mma_tiles(a_bufs, b_bufs, c_bufs, ready, empty, turn, stage_ptr, keep_ptr, counters_ptr, epoch_ptr, ready_ptr,
               claim_ptr, report_ptr, timeout_ns, rank, first_consumer, M, Mp, H, Fp, Fship, tail_group, kchunk, nch,
               ep0, ep1, ep2, ep3, done_ptr,
               TP: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, GROUP_M: gl.constexpr,
               ME: gl.constexpr, COOP: gl.constexpr, EPILOGUE: gl.constexpr, EP_VALUES: gl.constexpr,
               WAIT_READY: gl.constexpr, TIMED: gl.constexpr, COUNT_FIRST_AT_ONCE: gl.constexpr):
    """MMA partition ``ME`` (0 or 1). Ping-pong: the CTA's tiles ME, ME + 2, ... (its i-th tile is ring positions
    [i * k_iters, (i + 1) * k_iters)), each main loop in its turn. Cooperative: rows [ME * BM / 2, (ME + 1) * BM / 2)
    of every tile of the CTA. ``WAIT_READY``: every consumer started this call before any part is counted."""
    SUB_M: gl.constexpr = c_bufs.type.shape[1]
    PARTS: gl.constexpr = 2 if COOP else 1
    epoch = gl.load(epoch_ptr, volatile=True)
    if WAIT_READY:
        for q in range(TP):
            wait_flag(ready_ptr + first_consumer + q, epoch, claim_ptr, report_ptr, OP_CTA_STAGE0, rank,
                      q + first_consumer + READY_FLAG_BASE, 1, timeout_ns, TIMED)
    stage_desc = partition_descriptor(stage_ptr, nch * Mp, kchunk, SUB_M, BN)
    tiles_m = gl.cdiv(M, BM)
    tiles_n = gl.cdiv(Fp, BN)
    tiles_ship = gl.cdiv(Fship, BN)
    m0 = tail_group * GROUP_M * BM
    k_iters = gl.cdiv(H, BK)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    my_tiles = gl.cdiv(gl.maximum(tiles_m * tiles_n - pid, 0), nprog)
    c_buf = c_bufs.index(ME)
    acc = gl.zeros((SUB_M, BN), dtype=gl.float32, layout=acc_layout(BN))
    pend_m = -1
    pend_n = 0
    if COOP:
        p = 0
        for i in range(my_tiles):
            pid_m, pid_n = grouped_tile(pid + i * nprog, tiles_m, tiles_n, GROUP_M)
            acc, p = mma_tile(acc, a_bufs, b_bufs, ready, empty, p, k_iters, ME, False)
            acc = finish_tile(acc, empty, p)
            pend_m, pend_n = _finish_part(acc, c_buf, stage_desc, keep_ptr, counters_ptr, done_ptr, epoch, pid_m,
                                          pid_n, pid_m * BM + ME * SUB_M, M, Mp, Fp, Fship, tiles_m, tiles_n,
                                          tiles_ship, tail_group, m0, kchunk, nch, pend_m, pend_n, ep0, ep1, ep2, ep3,
                                          EPILOGUE, EP_VALUES, PARTS, BN, GROUP_M, COUNT_FIRST_AT_ONCE)
    else:
        for i in range(ME, my_tiles, 2):
            pid_m, pid_n = grouped_tile(pid + i * nprog, tiles_m, tiles_n, GROUP_M)
            # partition 0 goes first: on a fresh barrier a wait for the parity before phase 0 passes at once
            mbarrier.wait(turn.index(ME), ((i // 2) & 1) ^ (1 - ME))
            acc, p = mma_tile(acc, a_bufs, b_bufs, ready, empty, i * k_iters, k_iters, 0, False)
            mbarrier.arrive(turn.index(1 - ME))
            acc = finish_tile(acc, empty, p)
            pend_m, pend_n = _finish_part(acc, c_buf, stage_desc, keep_ptr, counters_ptr, done_ptr, epoch, pid_m,
                                          pid_n, pid_m * BM, M, Mp, Fp, Fship, tiles_m, tiles_n, tiles_ship,
                                          tail_group, m0, kchunk, nch, pend_m, pend_n, ep0, ep1, ep2, ep3, EPILOGUE,
                                          EP_VALUES, PARTS, BN, GROUP_M, COUNT_FIRST_AT_ONCE)
    tma.store_wait(0)  # no exit while a TMA store still reads this CTA's shared memory; the last part counted
    partition_barrier()
    if pend_m >= 0:
        _count(counters_ptr, done_ptr, epoch, pend_m, pend_n, tiles_m, tiles_n, tiles_ship, tail_group, kchunk, nch,
               PARTS, BN, GROUP_M)


@gluon.jit
def stage0_ws_kernel(
    x_ptr, w1_ptr, stage_ptr, keep_ptr, counters_ptr, done_ptr, epoch_ptr, ready_ptr, claim_ptr, report_ptr,
    timeout_ns, rank, first_consumer, M, Mp, H, Fp, ldw, Fship, tail_group, kchunk, nch, ep0, ep1, ep2, ep3,
    EPILOGUE: gl.constexpr, EP_VALUES: gl.constexpr, TP: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
    BK: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, COOP: gl.constexpr, WAIT_READY: gl.constexpr,
    TIMED: gl.constexpr, COUNT_FIRST_AT_ONCE: gl.constexpr, MMA_REGS: gl.constexpr, LOAD_REGS: gl.constexpr,
):
    dtype: gl.constexpr = x_ptr.dtype.element_ty
    # cooperative: each MMA partition's half of the rows, its own A box
    a_bufs, b_bufs, c_bufs, ready, empty, turn = allocate_ring(dtype, dtype, STAGES, BM, BN, BK, 2 if COOP else 1,
                                                               False)
    # (argument tuples written out in place: a tuple held in a variable turns its constexprs into tensors)
    gl.warp_specialize([
        (_mma_tiles, (a_bufs, b_bufs, c_bufs, ready, empty, turn, stage_ptr, keep_ptr, counters_ptr, epoch_ptr,
                      ready_ptr, claim_ptr, report_ptr, timeout_ns, rank, first_consumer, M, Mp, H, Fp, Fship,
                      tail_group, kchunk, nch, ep0, ep1, ep2, ep3, done_ptr, TP, BM, BN, BK, GROUP_M, 0, COOP,
                      EPILOGUE, EP_VALUES, WAIT_READY, TIMED, COUNT_FIRST_AT_ONCE)),
        (_mma_tiles, (a_bufs, b_bufs, c_bufs, ready, empty, turn, stage_ptr, keep_ptr, counters_ptr, epoch_ptr,
                      ready_ptr, claim_ptr, report_ptr, timeout_ns, rank, first_consumer, M, Mp, H, Fp, Fship,
                      tail_group, kchunk, nch, ep0, ep1, ep2, ep3, done_ptr, TP, BM, BN, BK, GROUP_M, 1, COOP,
                      EPILOGUE, EP_VALUES, WAIT_READY, TIMED, COUNT_FIRST_AT_ONCE)),
        (_load_tiles, (x_ptr, w1_ptr, a_bufs, b_bufs, ready, empty, M, H, Fp, ldw, BM, BN, BK, GROUP_M)),
    ], [4, 1], [MMA_REGS, LOAD_REGS])  # the second MMA partition one warpgroup, the loader one warp


FORMS = {"ws_pingpong": (128, 4), "ws_coop": (256, 3)}  # BN and ring stages of each form (BM, BK, GROUP_M: the plan's)
SPECS = {0: "gelu", 1: "gelu_tanh"}  # cta.ACT_GELU, cta.ACT_GELU_TANH: the generated epilogue's activation step


def config(form: str, plan_config) -> tuple:
    """The block config of ``form`` for stage 0 with the plan's config ``plan_config`` (BM, BN, BK, GROUP_M, stages,
    warps): the plan's row blocks, K-steps and row groups (the consumers count chunks by them), the form's BN and
    stages, 4 warps."""
    bn, stages = FORMS[form]
    return (plan_config[0], bn, plan_config[2], plan_config[3], stages, WARPS)


def unsupported(form, x: torch.Tensor, Fp: int, act: int, staged: bool, tma_store: bool, split_k: int, kchunk: int,
                fship: int, block_m: int) -> str | None:
    """Why ``launch`` cannot run stage 0 in ``form`` (None: it can): ``Fp`` the producer's columns, ``fship`` those
    the tail group ships, ``block_m`` the plan's row blocks."""
    why = refusal(form, tuple(FORMS), WARPS, x.dtype, block_m)
    if why:
        return why
    BN = FORMS[form][0]
    if act not in SPECS:
        return "SwiGLU (two accumulators): the Triton kernel only"
    if not (staged and tma_store):
        return "the copy-engine transport with TMA stores only (not stores into the consumers' buffers)"
    if split_k > 1:
        return f"no split-K runs ({split_k})"
    if kchunk % BN:
        return f"K-chunks of {kchunk} columns, which {BN}-column tiles do not divide"
    if fship != Fp and fship % BN:
        return f"a tail from column {fship}, not a multiple of {BN}"
    return None


def launch(x, w1, b1, stage, keep, counters, done, epoch, kchunk, nch, tp, first_consumer, act, form, plan_config,
           num_sms, Mp, fship, tail_group, ready=None, status=None, timeout_ns=0, rank=0, timed=True,
           count_first_at_once=False, tma_store=True, split_k=1):
    """``cta.launch_stage0``'s contract for ``form`` (``ws_pingpong`` / ``ws_coop``) where ``unsupported`` lets it:
    staged blocks ``[nch, Mp, kchunk]`` in ``stage`` by TMA, the tail into ``keep``; ``tma_store``, ``split_k``: what
    the caller asked for (the form refuses pointer stores and split-K runs)."""
    M, H = x.shape
    Fp = w1.shape[1]
    why = unsupported(form, x, Fp, act, stage is not None, tma_store, split_k, kchunk, fship, plan_config[0])
    if why:
        raise ValueError(f"CTA stage 0's {form} kernel: {why}")
    BM, BN, BK, GROUP_M, stages, _ = config(form, plan_config)
    spec = ("bias:0," if b1 is not None else "") + SPECS[act]
    fn, ptrs = generated.epilogue_fn(generated.build(spec, x.dtype), [b1] if b1 is not None else [], x.dtype, x)
    grid = (max(1, min(num_sms, launcher.cdiv(M, BM) * launcher.cdiv(Fp, BN))),)
    launcher.launch(stage0_ws_kernel, grid,
        x, w1, stage, keep if keep is not None else x, counters, done, epoch,
        ready if ready is not None else counters, *(status or (counters, counters)), timeout_ns, rank, first_consumer,
        M, Mp, H, Fp, w1.stride(0), fship, tail_group, kchunk, nch, *ptrs,
        EPILOGUE=fn, EP_VALUES=epilogue_values(), TP=tp, BM=BM, BN=BN, BK=BK, GROUP_M=GROUP_M, STAGES=stages,
        COOP=form == "ws_coop", WAIT_READY=ready is not None, TIMED=timed, COUNT_FIRST_AT_ONCE=count_first_at_once,
        MMA_REGS=MMA_REGS, LOAD_REGS=LOAD_REGS, num_warps=WARPS, maxnreg=MAXNREG,
    )
