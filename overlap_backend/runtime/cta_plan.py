"""The plan of one ``cta_pipeline_mlp`` call on ``symm``: block configs, the stage-1 share, the
stage-0 tails, the K-chunks, and the model of whole rounds that sizes them (docs/cta.md).

Shapes and ``knobs.cta`` only, so the same on every rank; the op (``runtime/cta_symm.py``), its
weight placement (``runtime/cta_weights.py``), the debug listing (``runtime/plan.py``) and the
probes read the same functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..spec import knobs, symm_layout


def block_configs(dtype, swiglu: bool, m: int, ns: int, num_sms: int) -> tuple[tuple, tuple]:
    """The (stage 0, stage 1) block configs of a call of ``m`` rows and ``ns`` stage-1 columns per
    rank, with ``GROUP_M`` (row blocks per row group) filled in. 16-bit calls of one row block
    whose stage 1 has few enough narrow tiles to split K (``split_runs``) take stage 1's decode
    config (``knobs.cta.STAGE1_CONFIG_DECODE``); 16-bit calls of at most ``knobs.cta.FEW_ROWS`` rows run
    both stages in 64-row blocks of ``knobs.cta.FEW_ROWS_WARPS`` warps."""
    cta = knobs.cta
    if dtype == torch.float32:
        c0, c1 = (cta.STAGE0_CONFIG_FP32_SWIGLU if swiglu else cta.STAGE0_CONFIG_FP32), cta.STAGE1_CONFIG_FP32
    else:
        c0, c1 = (cta.STAGE0_CONFIG_SWIGLU if swiglu else cta.STAGE0_CONFIG), cta.STAGE1_CONFIG
    bm = min(c0[0], c1[0])
    tiles_m, tiles_n1 = -(-m // bm), -(-ns // c1[1])
    narrow = cta.STAGE1_CONFIG_DECODE
    if dtype != torch.float32 and tiles_m == 1 and cta.STAGE1_SPLIT_K != 1 and 2 * -(-ns // narrow[1]) <= num_sms:
        c1, tiles_n1 = narrow, -(-ns // narrow[1])  # one row block, stage 1 split (split_runs) even so
    if dtype != torch.float32 and m <= cta.FEW_ROWS:
        warps = cta.FEW_ROWS_WARPS
        bm, c0, c1 = 64, (*c0[:5], warps), (*c1[:5], warps)  # one warpgroup's MMA height
        tiles_m = -(-m // bm)
    # A group of row blocks gives stage 1 at most one wave of tiles (all resident at once, walking
    # the group's K-chunks as stage 0 finishes them, in that order), as many as fit; W1 columns are
    # reused from L2 across the group. Groups of equal size: a small last group would leave most
    # SMs idle in the tail (measured: 32 row blocks in groups of 5,...,5,2 vs 8 groups of 4).
    most = max(1, min(tiles_m, num_sms // tiles_n1))
    groups = -(-tiles_m // most)
    group_m = -(-tiles_m // groups)
    return (bm, c0[1], c0[2], group_m, *c0[4:]), (bm, c1[1], c1[2], group_m, *c1[4:])


def share_unit(tp: int) -> int:
    """Stage-1 shares come in whole tiles of both stages, split evenly over the stage-0 ranks."""
    return math.lcm(256, 128 * tp)


def share_window(F: int, tp: int, swiglu: bool) -> tuple[int, int, int]:
    """(lo, hi, tail_max): the stage-1 shares ``f1`` that a call may take (``stage1_share``) and the
    most tail columns per stage-0 rank (``stage0_tail``); the placement keeps the weights for all
    of them, so it does not depend on M. SwiGLU keeps no tails (its share balances the stages)."""
    if swiglu:
        lo, hi = swiglu_share_range(F, tp, swiglu_share(F, tp))
        return lo, hi, 0
    unit = share_unit(tp)
    hi = int(F * knobs.cta.GELU_SHARE_MAX) // unit * unit if knobs.cta.GELU_FILL_SHARE else 0
    return 0, hi, tail_max(F, tp)


def tail_max(F: int, tp: int) -> int:
    """The most tail columns per stage-0 rank (``knobs.cta.TAIL_MAX`` of its columns, whole tiles)."""
    return int(F * knobs.cta.TAIL_MAX) // tp // 128 * 128 if knobs.cta.STAGE0_TAIL else 0


def swiglu_share(F: int, tp: int) -> int:
    """SwiGLU's balanced-work stage-1 share (see ``stage1_share``), whole share units."""
    if not knobs.cta.STAGE1_SHARE:
        return 0
    unit = share_unit(tp)
    return (F // (2 * (tp + 1))) // unit * unit


def swiglu_share_range(F: int, tp: int, base: int) -> tuple[int, int]:
    """The SwiGLU shares ``chunk_plan`` may pick in whole rounds (``knobs.cta.SWIGLU_SHARE_ROUNDS``)."""
    if not (knobs.cta.SWIGLU_SHARE_ROUNDS and base):
        return base, base
    unit = share_unit(tp)
    slack = knobs.cta.SWIGLU_SHARE_SLACK * unit
    return max(unit, base - slack), min(base + slack, (F - tp * 256) // unit * unit)


def swiglu_share_in_rounds(F: int, N: int, H: int, tp: int, base: int, **shape) -> int:
    """The share in ``swiglu_share_range`` whose stages' longer one is shortest in ``stage_costs``
    (``H``: twice the hidden size, gate and up), the nearest to ``base`` among equals."""
    lo, hi = swiglu_share_range(F, tp, base)
    unit = share_unit(tp)
    return min(range(lo, hi + 1, unit),
               key=lambda f1: (max(stage_costs(F, N, H, tp, f1, 0, **shape)), abs(f1 - base)))


def stage1_share(F: int, tp: int, swiglu: bool, tiles_m: int | None = None, bn: int = 256,
                 num_sms: int = 132) -> int:
    """Columns of the first GEMM that every stage-1 rank computes itself (``f1``, the last ones),
    before its own GEMM, which reads them first.

    - **SwiGLU** (balance): its first stage is two GEMMs, its second one; with ``f1`` columns moved,
      stage 0 does ``2 (F - f1) / tp`` and stage 1 ``2 f1 + F / tp`` (in units of H x N GEMM
      columns): equal at ``f1 = F / (2 (tp + 1))``.
    - **GELU** (fill): stage 1 would idle until stage 0's first round of tiles (one tile's time,
      about 0.1 ms at H=8192 on an H200) made the first K-chunk. With ``f1`` columns of its own, as
      many as one round of its own tiles of ``tiles_m`` row blocks x ``bn`` columns covers
      (``num_sms // tiles_m`` column tiles), it computes those first and then their part of its GEMM,
      while stage 0's first chunk is made and shipped. Within ``share_window``; 0 without ``tiles_m``.

    Whole units of ``lcm(256, 128 tp)`` columns."""
    if swiglu:
        return swiglu_share(F, tp)
    lo, hi, _ = share_window(F, tp, False)
    if hi == 0 or tiles_m is None:
        return 0
    unit = share_unit(tp)
    cols = knobs.cta.GELU_SHARE_COLS
    want = cols if cols is not None else (num_sms // tiles_m) * bn
    return max(lo, min(hi, want // unit * unit))


@dataclass(frozen=True)
class ChunkPlan:
    """How one call splits its work (shapes only, so the same on every rank)."""
    cfg0: tuple  # block configs of stage 0 and stage 1
    cfg1: tuple
    tp: int
    tiles_m: int
    groups: int  # row groups
    window: tuple[int, int, int]  # share_window: what the placement covers
    f1: int  # this call's stage-1 share
    fship: int  # columns each stage-0 rank ships for row group tail_group; the rest of its (F - f1) / tp is its tail
    tail: int
    tail_group: int  # the row group with the tail: the last one
    kchunk: int
    nch: int  # K-chunks per stage-0 rank
    nch1: int  # K-chunks of the stage-1 share
    split0: int = 1  # runs per stage-0 tile (split_runs)
    split1: int = 1  # runs per stage-1 tile (split_runs)

    @property
    def flag_words(self) -> int:
        """Chunk flags per flag region; more than ``symm_layout.CTA_CHUNK_WORDS // 2`` runs on p2p."""
        return self.groups * max(self.tp * self.nch, self.nch1)


def chunk_plan(M: int, F: int, N: int, tp: int, swiglu: bool, dtype, num_sms: int, H: int | None = None) -> ChunkPlan:
    cfg0, cfg1 = block_configs(dtype, swiglu, M, N // tp, num_sms)
    tiles_m = -(-M // cfg0[0])
    groups = -(-tiles_m // cfg0[3])
    window = share_window(F, tp, swiglu)
    h = H if H is not None else N
    shape = dict(tiles_m=tiles_m, group_m=cfg0[3], bn0=cfg0[1], bn1=cfg1[1], num_sms=num_sms)
    f1 = stage1_share(F, tp, swiglu, tiles_m, cfg0[1], num_sms)
    if swiglu:
        f1 = swiglu_share_in_rounds(F, N, 2 * h, tp, f1, **shape)
    fp = (F - f1) // tp
    # GELU's tails: one row group's, or the last group's of several (SwiGLU's window has none)
    most_tail = window[2] if groups == 1 or knobs.cta.MULTI_GROUP_TAIL else 0
    tail = stage0_tail(F, N, 2 * h if swiglu else h, tp, f1, fp, tail_max=most_tail, **shape)
    # Chunks cover what the widest group ships: all of fp, but for one group only its shipped part.
    kchunk, nch = k_chunks(fp - tail if groups == 1 else fp, cfg0[1], cfg1[2], groups, tp)
    nch1 = -(-f1 // kchunk)
    split0 = split_runs(tiles_m * -(-fp // cfg0[1]), -(-h // cfg0[2]), num_sms, knobs.cta.STAGE0_SPLIT_K)
    split1 = split_runs(tiles_m * -(-(N // tp) // cfg1[1]), nch1 + tp * nch, num_sms, knobs.cta.STAGE1_SPLIT_K)
    return ChunkPlan(cfg0, cfg1, tp, tiles_m, groups, window, f1, fp - tail, tail, groups - 1, kchunk, nch, nch1,
                     split0, split1)


def split_runs(tiles: int, steps: int, num_sms: int, want: int | None) -> int:
    """Split-K runs per tile of a stage's GEMM (the kernels' ``SPLIT_K``; ``steps``: the units its
    K splits in, stage 0's BK-steps or stage 1's K-chunks): with ``tiles`` fewer than half the
    SMs (decode sizes: a tile streams ``K x BN`` of the weight alone, so few tiles read it at a
    fraction of the GPU's bandwidth), as many runs as fill the SMs; 1 otherwise; ``want`` (the
    stage's ``knobs.cta.STAGE<i>_SPLIT_K``), when set, for every call. At most one run per step;
    none where a split counter per tile would not fit after the row counters
    (``symm_layout.CTA_Y_COUNTERS``)."""
    if want is None:
        want = num_sms // tiles if 2 * tiles <= num_sms else 1
    if 2 * tiles > symm_layout.CTA_ROW_WORDS:
        return 1
    return max(1, min(int(want), steps))


def _rounds(tiles: int, num_sms: int) -> int:
    return -(-tiles // num_sms)


def stage_costs(F: int, N: int, H: int, tp: int, f1: int, tail: int, *, tiles_m: int, group_m: int, bn0: int,
                bn1: int, num_sms: int) -> tuple[int, int]:
    """The time of each stage's GEMMs in a model of whole rounds (a persistent kernel's tiles run
    ``num_sms`` at a time, and a round lasts as long as its deepest tile; units: one SM's tile
    width x K): stage 0 makes its ``tiles_m x (F - f1)/tp`` first-GEMM tiles (``bn0`` wide, ``H``
    deep: the hidden size, twice it for SwiGLU's gate and up), then its tail for the last row
    group, ``tp x`` that group's row blocks x ``N/tp/bn1`` tiles, ``tail`` deep. Stage 1 makes its
    share (``f1`` columns), then one round of GEMM2 tiles per row group (a group holds at most one
    wave), ``F`` deep but ``F - tp * tail`` for the last group."""
    groups = -(-tiles_m // group_m)
    fp = (F - f1) // tp
    last_rows = tiles_m - (groups - 1) * group_m
    stage0 = _rounds(tiles_m * -(-fp // bn0), num_sms) * bn0 * H
    stage0 += _rounds(tp * last_rows * -(-(N // tp) // bn1), num_sms) * bn1 * tail if tail else 0
    stage1 = (_rounds(tiles_m * -(-f1 // bn0), num_sms) * bn0 * H if f1 else 0) + bn1 * (groups * F - tp * tail)
    return stage0, stage1


def stage0_tail(F: int, N: int, H: int, tp: int, f1: int, fp: int, *, tiles_m: int, group_m: int, bn0: int, bn1: int,
                num_sms: int, tail_max: int) -> int:
    """Columns each stage-0 rank keeps and multiplies by their W2 rows itself, for the last row
    group (its tail; 0: none). That group's stage-1 tiles then finish without waiting for the
    columns stage 0 makes last; the earlier groups' tiles wait for nothing of it.

    Sized so that both stages take the same time in ``stage_costs``' model of whole rounds: stage
    0's ``R0`` rounds of first-GEMM tiles and the tail's ``Rt`` rounds, ``tail`` deep, against stage
    1's ``Rs`` rounds of share and one round of GEMM2 per row group:
    ``R0 bn0 H + Rt bn1 d = Rs bn0 H + bn1 (G F - tp d)``. Rounds, not work: at M=512 on an H200
    (GELU, F=28672) stage 0's 316 tiles take 3 rounds of 132 SMs, the time of 396; a tail sized for
    equal work (8448 columns) measured slower than ones of 4096-6144 (0.48 vs 0.45 ms GPU-bound),
    and this gives 6144. Stage 0 ships whole tiles of ``bn0`` columns, at least one; at most
    ``tail_max``."""
    if not tail_max:
        return 0
    if knobs.cta.TAIL_COLS is not None:
        want = knobs.cta.TAIL_COLS
    else:  # both stages' times are linear in the tail: solve stage0(d) = stage1(d)
        shape = dict(tiles_m=tiles_m, group_m=group_m, bn0=bn0, bn1=bn1, num_sms=num_sms)
        s0, s1 = stage_costs(F, N, H, tp, f1, 0, **shape)
        t0, t1 = stage_costs(F, N, H, tp, f1, 1, **shape)
        want = (s1 - s0) // ((t0 - s0) - (t1 - s1))
    fship = max(bn0, (fp - max(0, want)) // bn0 * bn0)
    if fp - fship > tail_max:
        fship = -(-(fp - tail_max) // bn0) * bn0
    return max(0, fp - fship)


def k_chunks(fp: int, bn0: int, bk1: int, groups: int, tp: int) -> tuple[int, int]:
    """(chunk width, chunks per stage-0 rank): about ``knobs.cta.K_CHUNKS`` chunks of whole stage-0
    tiles, fewer when the flag region would overflow (``groups`` row groups)."""
    unit = math.lcm(bn0, bk1)
    want = knobs.cta.K_CHUNKS
    while True:
        kchunk = -(-(-(-fp // want)) // unit) * unit
        nch = -(-fp // kchunk)
        if groups * tp * nch <= symm_layout.CTA_CHUNK_WORDS // 2 or nch == 1:
            return kchunk, nch
        want = max(1, want // 2)
