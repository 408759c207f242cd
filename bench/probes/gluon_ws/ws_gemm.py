"""Warp-specialized persistent bf16 GEMM for Hopper (sm_90a) in Gluon (Triton 3.6 and 3.9: the few names
that changed between them, and the ring, come from ``overlap_backend/codegen/gluon_ring.py``).

    C[M, N] = A[M, K] @ B[K, N]   (bf16 in, fp32 accumulate, bf16 out)

A: contiguous [M, K]. B: contiguous [K, N] (N-major smem tile [BK, BN], fed to wgmma as is: Triton 3.6's
``warpgroup_mma`` takes an MN-major B for 16-bit types), or ``w.t()`` of a contiguous [N, K] weight (K-major tile
[BN, BK], fed as the permuted view ``.permute((1, 0))``). ``launch`` picks by B's strides.

Partitions (``gl.warp_specialize``), each MMA partition exactly one warpgroup (4 warps):
  * loader (worker, 1 warp, few registers): walks the CTA's tiles and K-chunks and issues the TMA loads of A and
    B into a ring of STAGES smem stages; it runs ahead into the next tile while the MMA warps do an epilogue.
  * two MMA partitions (the default partition + one 4-warp worker):
      - "coop":     both work on every tile of the CTA, each on one half of its rows (BM/2 x BN each, as
                    CUTLASS's cooperative kernel); a stage is free once both have retired their wgmma on it.
      - "pingpong": each owns alternate tiles of the CTA (BM x BN each), as CUTLASS's ping-pong kernel: their
                    main loops take turns (an mbarrier pair orders them), so one's epilogue overlaps the other's
                    MMAs.
  * "coop1": one MMA partition only (the default partition, 4 warps) on BM x BN tiles.
Why partitions of one warpgroup and not one 8-warp default partition: Triton lowers ``mbarrier.arrive`` to an
arrive by the partition's thread 0 only, and ``wgmma.wait_group`` retires only the calling warpgroup's wgmmas, so
an 8-warp partition would free a stage while the other warpgroup's wgmma may still read it (or need a bar.sync
per K step). One warpgroup per partition makes "thread 0 arrives after its wait" exact.

Epilogue: the accumulator goes to a per-partition smem buffer and out with a TMA store that is not waited for;
``tma.store_wait(0)`` comes only before that buffer is written again (the next tile's epilogue).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
# the ring, its stores and tile order as the ops' Gluon kernel has them
from overlap_backend.codegen.gluon_ring import (acc_layout, finish_tile, init_ring, load_stage,  # noqa: E402
                                                mma_tile, store_tile)
from overlap_backend.codegen.tiles import grouped_tile  # noqa: E402

VARIANTS = ("coop", "pingpong", "coop1")


# --------------------------------------------------------------------------------------------- tile schedule
@gluon.constexpr_function
def _a_split(pingpong, num_mma):
    """How many MMA partitions share each tile (and so each smem stage): coop's split of the rows, else 1."""
    return 1 if pingpong else num_mma


@gluon.jit
def _num_my_tiles(M, N, BM: gl.constexpr, BN: gl.constexpr):
    """Tiles of this CTA (it takes pid, pid + grid, ...), and the grid's tile counts along M and N."""
    num_pid_m = gl.cdiv(M, BM)
    num_pid_n = gl.cdiv(N, BN)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    return gl.cdiv(num_pid_m * num_pid_n - pid, nprog), num_pid_m, num_pid_n


@triton.jit
def _no_epilogue(x, rows, cols, mask, N, P0, P1, P2, P3):
    """``store_tile``'s epilogue for a plain GEMM: the accumulator as it is."""
    return x


# --------------------------------------------------------------------------------------------- partitions
@gluon.jit
def _loader(a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K,
            BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, GROUP_M: gl.constexpr, B_KMAJOR: gl.constexpr):
    """Fill the smem ring in the order the MMA partitions drain it: tile by tile, K-chunk by K-chunk (coop: A in one
    box per MMA partition's half of the rows). TMA zero-fills the out-of-bounds part of a box."""
    my_tiles, num_pid_m, num_pid_n = _num_my_tiles(M, N, BM, BN)
    k_iters = gl.cdiv(K, BK)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    p = 0  # ring position: counts every stage fill of this CTA
    for i in range(my_tiles):
        pid_m, pid_n = grouped_tile(pid + i * nprog, num_pid_m, num_pid_n, GROUP_M)
        for ki in range(k_iters):
            p = load_stage(a_desc, pid_m * BM, b_desc, pid_n * BN, ki * BK, a_bufs, b_bufs, ready, empty, p, B_KMAJOR)


@gluon.jit
def _mma_partition(a_bufs, b_bufs, c_bufs, ready, empty, turn, c_desc, M, N, K,
                   BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, GROUP_M: gl.constexpr,
                   ME: gl.constexpr, NUM_MMA: gl.constexpr, PINGPONG: gl.constexpr, B_KMAJOR: gl.constexpr):
    """One MMA warpgroup: main loop + epilogue for its tiles (pingpong) or its half of every tile (coop).

    ping-pong turn-taking: partition ME waits for ``turn[ME]`` before its main loop and arrives on
    ``turn[1 - ME]`` once it has waited for and issued its last K-chunk. That keeps the two main loops in ring
    order, which the shared ring needs: a partition must not wait on a stage's ``ready`` barrier for lap n while
    lap n - 1 of that stage (the other partition's) is still pending, as a parity wait would then pass at once.
    """
    A_SPLIT: gl.constexpr = _a_split(PINGPONG, NUM_MMA)
    SUB_M: gl.constexpr = BM // A_SPLIT
    acc = gl.zeros((SUB_M, BN), dtype=gl.float32, layout=acc_layout(BN))
    my_tiles, num_pid_m, num_pid_n = _num_my_tiles(M, N, BM, BN)
    k_iters = gl.cdiv(K, BK)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    c_buf = c_bufs.index(ME)
    if PINGPONG:
        for i in range(ME, my_tiles, NUM_MMA):
            pid_m, pid_n = grouped_tile(pid + i * nprog, num_pid_m, num_pid_n, GROUP_M)
            # partition 0 goes first: on a fresh barrier a parity-1 wait passes at once
            mbarrier.wait(turn.index(ME), ((i // NUM_MMA) & 1) ^ (1 - ME))
            acc, p = mma_tile(acc, a_bufs, b_bufs, ready, empty, i * k_iters, k_iters, 0, B_KMAJOR)
            mbarrier.arrive(turn.index(1 - ME))
            acc = finish_tile(acc, empty, p)
            store_tile(acc, c_desc, c_buf, 0, pid_m * BM, pid_n * BN, N, 0, 0, 0, 0, False, _no_epilogue)
    else:
        p = 0
        for i in range(my_tiles):
            pid_m, pid_n = grouped_tile(pid + i * nprog, num_pid_m, num_pid_n, GROUP_M)
            acc, p = mma_tile(acc, a_bufs, b_bufs, ready, empty, p, k_iters, ME, B_KMAJOR)
            acc = finish_tile(acc, empty, p)
            store_tile(acc, c_desc, c_buf, 0, pid_m * BM + ME * SUB_M, pid_n * BN, N, 0, 0, 0, 0, False,
                       _no_epilogue)
    tma.store_wait(0)  # don't exit with a TMA store still reading this CTA's smem


# --------------------------------------------------------------------------------------------- kernel
@gluon.jit
def ws_gemm_kernel(a_desc, b_desc, c_desc, M, N, K,
                   BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, GROUP_M: gl.constexpr,
                   STAGES: gl.constexpr, NUM_MMA: gl.constexpr, PINGPONG: gl.constexpr, B_KMAJOR: gl.constexpr,
                   MMA_REGS: gl.constexpr, LOAD_REGS: gl.constexpr):
    """Allocate the smem ring, the epilogue buffers and the barriers, then fork the partitions."""
    gl.static_assert(NUM_MMA == 1 or NUM_MMA == 2)
    A_SPLIT: gl.constexpr = _a_split(PINGPONG, NUM_MMA)
    dtype: gl.constexpr = a_desc.dtype
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES * A_SPLIT] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [NUM_MMA] + c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    init_ring(ready, empty, turn, A_SPLIT)

    # (argument tuples written out in place: a tuple held in a variable turns its constexprs into tensors)
    if NUM_MMA == 2:
        gl.warp_specialize([
            (_mma_partition, (a_bufs, b_bufs, c_bufs, ready, empty, turn, c_desc, M, N, K, BM, BN, BK, GROUP_M,
                              0, NUM_MMA, PINGPONG, B_KMAJOR)),
            (_mma_partition, (a_bufs, b_bufs, c_bufs, ready, empty, turn, c_desc, M, N, K, BM, BN, BK, GROUP_M,
                              1, NUM_MMA, PINGPONG, B_KMAJOR)),
            (_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, BM, BN, BK, GROUP_M, B_KMAJOR)),
        ], [4, 1], [MMA_REGS, LOAD_REGS])
    else:
        gl.warp_specialize([
            (_mma_partition, (a_bufs, b_bufs, c_bufs, ready, empty, turn, c_desc, M, N, K, BM, BN, BK, GROUP_M,
                              0, NUM_MMA, PINGPONG, B_KMAJOR)),
            (_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, BM, BN, BK, GROUP_M, B_KMAJOR)),
        ], [1], [LOAD_REGS])


# --------------------------------------------------------------------------------------------- host side
DEFAULT_CONFIGS = {
    # coop: 128x256 tile, two warpgroups of 64x256 (128 fp32 acc regs/thread each); 3 stages = 144 KiB + C 64 KiB
    "coop": dict(variant="coop", BM=128, BN=256, BK=64, GROUP_M=8, STAGES=3),
    # pingpong: 128x128 tile per warpgroup (128 acc regs/thread); 4 stages = 128 KiB + 2 C buffers of 32 KiB
    "pingpong": dict(variant="pingpong", BM=128, BN=128, BK=64, GROUP_M=8, STAGES=4),
    # coop1: one warpgroup, 128x128 tile; 5 stages = 160 KiB + C 32 KiB
    "coop1": dict(variant="coop1", BM=128, BN=128, BK=64, GROUP_M=8, STAGES=5),
}


def kernel_params(config):
    """Constexprs and launch options of a config dict (variant, BM, BN, BK, GROUP_M, STAGES[, regs]).

    Register budget: the kernel runs 4 * ceil(warps / 4) warps; with ``maxnreg`` R at entry, 3 warpgroups x 128
    threads x R must fit the 64K-register file (R <= 168 for 12 warps). Triton then emits setmaxnreg: each worker
    gets what ``worker_num_regs`` asks, the default partition what is left.
    """
    v = config["variant"]
    if v not in VARIANTS:
        raise ValueError(f"variant {v!r} not in {VARIANTS}")
    num_mma = 1 if v == "coop1" else 2
    load_regs = config.get("load_regs", 40)
    if num_mma == 2:  # 12 warps: loader's warpgroup at load_regs, both MMA warpgroups at the rest
        maxnreg = config.get("maxnreg", 168)
        mma_regs = config.get("mma_regs", ((maxnreg * 3 - load_regs) // 2) // 8 * 8)
    else:  # 8 warps: 2 warpgroups x 128 threads x 240 fit (ptxas ignores a cap of 256)
        maxnreg = config.get("maxnreg", 240)
        mma_regs = 0  # unused: the MMA warpgroup is the default partition
    const = dict(BM=config["BM"], BN=config["BN"], BK=config["BK"], GROUP_M=config["GROUP_M"],
                 STAGES=config["STAGES"], NUM_MMA=num_mma, PINGPONG=(v == "pingpong"), MMA_REGS=mma_regs,
                 LOAD_REGS=load_regs)
    return const, dict(num_warps=4, maxnreg=maxnreg)


def block_shapes(config, b_kmajor):
    """TMA box shapes of A, B, C for a config: C's (and coop's A's) box is one MMA partition's share of a tile."""
    BM, BN, BK = config["BM"], config["BN"], config["BK"]
    split = 2 if config["variant"] == "coop" else 1
    return [BM // split, BK], ([BN, BK] if b_kmajor else [BK, BN]), [BM // split, BN]


def make_descs(a, b, out, config):
    """Gluon TensorDescriptors for A [M,K], B ([K,N] N-major or [N,K] K-major) and C [M,N]; B_KMAJOR flag."""
    b_kmajor = b.stride(0) == 1 and b.stride(1) == b.shape[0]  # b is w.t() of a contiguous [N, K]
    bt = b.t() if b_kmajor else b
    a_blk, b_blk, c_blk = block_shapes(config, b_kmajor)
    gdt = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[a.dtype]
    descs = []
    for t, blk in ((a, a_blk), (bt, b_blk), (out, c_blk)):
        assert t.stride(-1) == 1, "TMA needs a contiguous last dimension"
        descs.append(TensorDescriptor.from_tensor(t, blk, gl.NVMMASharedLayout.get_default_for(blk, gdt)))
    return descs, b_kmajor


@functools.lru_cache(maxsize=None)
def _num_sms(device_index):
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def prepare(a, b, out, config):
    """A zero-argument callable that launches the GEMM with descriptors built once (for timing loops)."""
    M, K = a.shape
    K2, N = b.shape
    assert K == K2 and tuple(out.shape) == (M, N) and a.dtype == b.dtype == out.dtype
    (a_desc, b_desc, c_desc), b_kmajor = make_descs(a, b, out, config)
    const, opts = kernel_params(config)
    tiles = triton.cdiv(M, config["BM"]) * triton.cdiv(N, config["BN"])
    dev = a.device.index if a.device.index is not None else torch.cuda.current_device()
    grid = (min(_num_sms(dev), tiles), )

    def run():
        ws_gemm_kernel[grid](a_desc, b_desc, c_desc, M, N, K, B_KMAJOR=b_kmajor, **const, **opts)
        return out

    return run


def launch(a, b, out, config):
    """out[M, N] = a[M, K] @ b[K, N] (bf16); b either contiguous [K, N] or ``w.t()`` of a contiguous [N, K].

    Persistent: grid = min(#SMs, #tiles), each CTA takes tiles pid, pid + grid, ... in GROUP_M order.
    """
    return prepare(a, b, out, config)()


def parse_config(spec):
    """'variant:BMxBNxBK:GROUP_M:STAGES' (e.g. 'pingpong:128x128x64:8:4') or a bare variant name -> config."""
    parts = spec.split(":")
    if len(parts) == 1:
        return dict(DEFAULT_CONFIGS[parts[0]])
    v, tile, group, stages = parts
    BM, BN, BK = (int(x) for x in tile.split("x"))
    return dict(variant=v, BM=BM, BN=BN, BK=BK, GROUP_M=int(group), STAGES=int(stages))


def config_name(config):
    return f"{config['variant']}:{config['BM']}x{config['BN']}x{config['BK']}:{config['GROUP_M']}:{config['STAGES']}"
