"""The ``symm`` lowering of ``overlap::cta_pipeline_mlp``: CTA-pipelining (kernels: ``codegen/cta.py``).

The group's ``ws`` ranks form two stages of ``tp = ws // 2`` ranks. Stage 0 computes the first GEMM
and the activation, stage 1 the second GEMM, *at the same time*: stage-0 tiles go straight into the
stage-1 ranks' memory and every stage-1 CTA waits only for the K-chunks of the rows it reads.

Weight placement: the op receives tensor-parallel shards (``w1``/``w3``: [H, F/ws] columns,
``w2``: [F/ws, N] rows). Once per weight version it gathers them (collective) and keeps, on stage-0
rank ``p``, the columns ``[p*F/tp, (p+1)*F/tp)`` of W1 (and W3, b1, b3), and on stage-1 rank
``t`` the columns ``[t*N/tp, (t+1)*N/tp)`` of W2 and of ``sum_r b2_r``. That costs, per rank, one
extra copy of the weight its stage uses (logged; ``placement_bytes()``): the user's shards stay
where they are. The cache is keyed by the weights' identities and invalidated when any of them
changes (``Tensor._version``, which in-place optimiser steps bump on every rank alike).

Assumption of the rewrite (true of the tensor-parallel MLP the pass matches): ``x`` is the same on
every rank; stage-0 ranks read their own copy.

What the kernels do not cover falls back to ``p2p`` (a decision that depends only on shapes,
dtypes and arguments, so the same on every rank).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor
from torch.multiprocessing.reductions import StorageWeakRef

from ..codegen import launcher
from ..spec import symm_layout
from . import cuda as _cuda
from . import symm
from .lowering import register
from .ops import _group_size
from .symm.lowering_helpers import PATHS, load_kernels, run_on_p2p, tma_aligned, tma_problem

log = logging.getLogger("overlap_backend.symm")

K_CHUNKS = 4  # K-chunks per stage-0 rank: a stage-1 CTA waits (and refills its pipeline) this often
# How stage-0 tiles reach the stage-1 ranks: "ce" (stored locally, chunk-major; the copy engine ships
# each (row group, K-chunk) block as soon as its tiles are counted) or "peer" (the epilogue stores
# straight into the consumers' memory). The same on every rank (a module setting); bench/ compares.
TRANSPORT = "ce"
STAGE1_SHARE = True  # SwiGLU: stage-1 ranks compute a share of the first GEMM (see stage1_share)
# GELU: stage-1 ranks compute, first, about one round of tiles of the first GEMM's last columns, so
# that they work while stage 0's first round makes the first K-chunk (the pipeline's fill; see
# stage1_share). At most GELU_SHARE_MAX of F: the placement keeps that window of W1 on the stage-1
# ranks for every M (memory per stage-1 rank: GELU_SHARE_MAX x H x F more elements).
GELU_FILL_SHARE = True
GELU_SHARE_MAX = 0.3
GELU_SHARE_COLS: int | None = None  # bench/ override of the per-call GELU share (columns; within the window)
# GELU, one row group: each stage-0 rank keeps the last columns it makes (its *tail*) and multiplies
# them by their W2 rows itself (codegen/cta.py: tail_kernel); stage 1 adds those partial products in
# its epilogue instead of waiting for the columns stage 0 makes last (the pipeline's drain), and
# the stages' work balances (stage0_tail). At most TAIL_MAX of F / tp per stage-0 rank: the
# placement keeps the W2 rows of that window (memory per stage-0 rank: about (GELU_SHARE_MAX +
# TAIL_MAX) x F x N / tp elements).
STAGE0_TAIL = True
TAIL_MAX = 0.3
TAIL_COLS: int | None = None  # bench/ override of the per-call tail (columns per stage-0 rank)
# GELU with more than one row group: the last group's tail only (the earlier groups' stage-1 tiles
# would otherwise wait for tails made at the end). Stage 1 does more GEMM work than stage 0 there
# (all of GEMM2 plus its share), and the last group's tail moves some of it over.
MULTI_GROUP_TAIL = True
# SwiGLU, one row group: the same tails, paid for by a larger stage-1 share so that the stages still
# balance (swiglu_tail_share). Each stage-0 rank keeps about SWIGLU_TAIL_FRACTION of its columns, one
# K-chunk's worth: the last chunk stage 1 would otherwise still consume after stage 0 finished.
# Off: correct on GPUs, but measured within the noise (2xH200, M=512: 0.678 vs 0.700 ms, where pairs
# with the same plan differed by 3 %; bench/bench_cta.py --swiglu-tails off,on).
SWIGLU_TAIL = False
SWIGLU_TAIL_FRACTION = 0.2
# SwiGLU: the stage-1 share that balances the stages in whole rounds of SMs (stage_costs), within
# SWIGLU_SHARE_SLACK share units of the one that balances work (stage1_share). At M=512 on an H200
# (F=28672) the balanced-work share leaves stage 0 with 672 tiles, 5.1 rounds of 132 SMs; 512 more
# columns on stage 1 make it 5. Measured on 2xH200 (bench/bench_cta.py --swiglu-shares work,rounds,
# thirteenth session): M=512 0.624 vs 0.696 ms; at M=1024 and 4096 it picks the same share as before.
SWIGLU_SHARE_ROUNDS = True
SWIGLU_SHARE_SLACK = 4
# Stage 0 counts the first row group's tiles right after their stores, not a main loop later: they
# are the pipeline's fill. Measured on 2xH200 (bench/probe_cta.py, GELU): 3.17 vs 3.25 ms at M=4096,
# 0.60 vs 0.66 at M=512 (noisy there), equal at 1024.
COUNT_FIRST_GROUP_AT_ONCE = True
# Stage 0 (and the stage-1 share) stores its staged tiles by TMA instead of masked pointer stores,
# counting each tile once its bulk store completed. Measured (thirteenth session): stage 0 alone on
# one H200 (bench/probe_ws.py --stage0) 0.640 vs 0.649 ms at M=1024, 0.379 vs 0.385 at 512, 2.849
# vs 2.994 at 4096; the whole op on 2xH200, GPU-bound (bench/probe_cta.py --gpu-bound, GELU)
# 0.430 / 0.752 / 2.798 vs 0.434 / 0.756 / 2.827 ms at M = 512 / 1024 / 4096.
STAGE0_TMA_STORE = True
# Stage 0's final, partial round of tiles in half-width tiles when they are all tail tiles and at
# most half a round (cta.split_tail_tiles). At M=512 (GELU, F=28672, H200) stage 0's 316 tiles make
# 2.4 rounds, and stage 0 -> its tail -> stage 1's epilogue is the critical path. Measured on 2xH200
# (thirteenth session, bench/probe_cta.py --gpu-bound --gpu-bound-trace): stage 0 265 vs 285 us,
# the op 0.421 vs 0.434 ms per call; M=1024 does not split, M=4096 splits 24 tiles (2.835 vs 2.833).
STAGE0_SPLIT_LAST = True
# One stage-0 rank (2 GPUs): the last row group's stage-1 rows are shipped before the tails' partial
# products are added, and each rank adds them itself (the stage-0 rank its own copy, in its collect),
# so that the partial products' transfer and the rows' transfer overlap instead of following each
# other (8 MB each at M=512, H=8192: about 20 us of NVLink each). With more stage-0 ranks every rank
# would need every stage-0 rank's partial products: not done there.
SHIP_BEFORE_TAILS = True
_staging: dict[tuple, Tensor] = {}
# Eager calls of at most EAGER_GRAPH_MAX_M rows replay a CUDA graph of the op, captured on their second
# call per call signature: one graph launch and two copies (the input in, the output out) instead of
# 4-6 kernel launches and ~20 driver calls, 0.4-0.7 ms of host time per call at M=512 on the H200
# hosts, as much as the op's GPU time. Off until measured on GPUs.
EAGER_GRAPHS = False
EAGER_GRAPH_MAX_M = 1024
EAGER_GRAPHS_KEPT = 8  # captured call signatures kept (each holds its graph's memory pool)
_staging_kept: list[Tensor] = []  # staging buffers outgrown after a call was captured (graphs may use them)
_captured = False  # a cta_pipeline_mlp call was captured in a CUDA graph (in this process)
# Block configs (BM, BN, BK, GROUP_M placeholder, num_stages, num_warps); bench/ may override.
STAGE0_CONFIG = {False: (128, 256, 64, 0, 3, 8), True: (128, 128, 64, 0, 3, 8)}  # by "SwiGLU" (two accumulators)
STAGE1_CONFIG = (128, 256, 64, 0, 3, 8)
STAGE0_CONFIG_FP32 = {False: (128, 128, 32, 0, 3, 8), True: (64, 128, 32, 0, 3, 4)}
STAGE1_CONFIG_FP32 = (128, 128, 32, 0, 3, 8)


@dataclass
class _Placement:
    refs: tuple
    versions: tuple
    w1: Tensor | None = None  # stage 0: [H, F/tp]
    b1: Tensor | None = None
    w3: Tensor | None = None
    b3: Tensor | None = None
    w2: Tensor | None = None  # stage 1: [F, N/tp]
    b2: Tensor | None = None  # stage 1: [N/tp] float32, the sum of every rank's b2
    w2_tail: Tensor | None = None  # stage 0: the W2 rows [tail_rows[0], tail_rows[1]) its tails can take, [., N]
    tail_rows: tuple[int, int] = (0, 0)
    first_views: dict = field(default_factory=dict)  # first_gemm_weights, per share

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.w1, self.b1, self.w3, self.b3, self.w2, self.b2,
                                                          self.w2_tail) if t is not None)

    def first_gemm_weights(self, stage: int, idx: int, tp: int, F: int, f1: int, hi: int) -> tuple:
        """(w1, b1, w3, b3) of a call's part of the first GEMM, views into this placement (which
        covers every share up to ``hi``, see ``_place``): stage-0 rank ``idx``'s columns
        ``[idx*(F-f1)/tp, (idx+1)*(F-f1)/tp)``, or the stage-1 share, the last ``f1`` columns.
        Made once per share (slicing costs host time on every call)."""
        key = (stage, idx, tp, F, f1, hi)
        views = self.first_views.get(key)
        if views is None:
            if stage == 0:
                cols = slice(idx * (hi - f1) // tp, idx * (hi - f1) // tp + (F - f1) // tp)
            else:
                cols = slice(hi - f1, hi)
            views = self.first_views[key] = tuple(None if t is None else (t[:, cols] if t.dim() == 2 else t[cols])
                                                  for t in (self.w1, self.b1, self.w3, self.b3))
        return views

    def valid(self, tensors) -> bool:
        return all((r is None and t is None) or (r is not None and t is not None and _same_storage(r, t))
                   for r, t in zip(self.refs, tensors)) and self.versions == _versions(tensors)


_placements: dict[tuple, _Placement] = {}
# Host time per call matters at decode / small-prefill sizes (an eager call at M=512 was host-bound
# on the H200 hosts: about 0.45 ms to enqueue), so what follows from shapes and settings alone is
# computed once: _problem's verdict, the chunk plan, and whether this call's kernel variants were
# compiled and loaded already (launcher.preloading computes a variant key per launch otherwise).
_verdicts: dict[tuple, str | None] = {}
_plans: dict[tuple, "ChunkPlan"] = {}
_preloaded_calls: dict[tuple, bool] = {}
_CACHE_MAX = 4096  # entries per cache (distinct shapes); beyond it a cache starts over


def _cached(cache: dict, key, compute):
    """``cache[key]``, from ``compute()`` the first time (a server with ever new token counts: a cache
    beyond ``_CACHE_MAX`` entries starts over)."""
    if key not in cache:
        if len(cache) >= _CACHE_MAX:
            cache.clear()
        cache[key] = compute()
    return cache[key]


# The module settings a plan or a kernel variant depends on, by name (bench/ changes them): part of
# every cache key, and what a probe saves and restores around a variant.
SETTINGS = ("K_CHUNKS", "TRANSPORT", "STAGE1_SHARE", "GELU_FILL_SHARE", "GELU_SHARE_MAX", "GELU_SHARE_COLS",
            "STAGE0_TAIL", "TAIL_MAX", "TAIL_COLS", "MULTI_GROUP_TAIL", "SWIGLU_TAIL", "SWIGLU_TAIL_FRACTION",
            "SWIGLU_SHARE_ROUNDS", "SWIGLU_SHARE_SLACK", "COUNT_FIRST_GROUP_AT_ONCE", "STAGE0_TMA_STORE",
            "STAGE0_SPLIT_LAST", "SHIP_BEFORE_TAILS", "EAGER_GRAPHS", "EAGER_GRAPH_MAX_M", "STAGE0_CONFIG",
            "STAGE1_CONFIG", "STAGE0_CONFIG_FP32", "STAGE1_CONFIG_FP32")


def _settings() -> tuple:
    """The current values of ``SETTINGS`` (hashable: the config dicts as item tuples)."""
    values = (globals()[name] for name in SETTINGS)
    return tuple(tuple(v.items()) if isinstance(v, dict) else v for v in values)


def _shapes(*tensors) -> tuple:
    return tuple(None if t is None else (t.shape, t.dtype, t.device.type) for t in tensors)  # torch.Size hashes


def prune_placements() -> int:
    """Drop the placements of weights that no longer exist (a model that was freed, the old weights
    of a reloaded one): their keys can never match again, and each holds a copy of a weight.
    Returns the number dropped. Placements of live weights (any shape of ``x``, any compiled graph
    that calls the op with them) are kept and reused."""
    dead = [k for k, p in _placements.items() if any(r is not None and r.expired() for r in p.refs)]
    for k in dead:
        del _placements[k]
    return len(dead)


def placement_bytes() -> int:
    """Memory held by the re-laid-out weights of this process."""
    return sum(p.nbytes() for p in _placements.values())


def _versions(tensors) -> tuple:
    return tuple(t._version if t is not None else -1 for t in tensors)  # a view shares its base's counter


def _storage_ref(t: Tensor) -> StorageWeakRef:
    """A weak reference to the storage that holds ``t``. Graphs pass weights as fresh views every call
    (``w.t()``, Inductor's ``reinterpret_tensor``, whose ``_base`` is not the parameter), so a
    placement is tied to the storage, not to a tensor object. While the weak reference lives, the
    storage's control block is not freed, so a live storage at the same address is the same one."""
    return StorageWeakRef(t.untyped_storage())


def _same_storage(ref: StorageWeakRef, t: Tensor) -> bool:
    return not ref.expired() and ref.cdata == t.untyped_storage()._cdata


def _gather(t: Tensor, group, dim: int) -> Tensor:
    parts = [torch.empty_like(t, memory_format=torch.contiguous_format) for _ in range(group.size())]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.cat(parts, dim)


def _place(st: symm.GroupState, w1, b1, w3, b3, w2, b2, window: tuple[int, int, int],
           capturing: bool = False) -> _Placement:
    """This rank's weights, for every stage-1 share ``f1`` in ``window = (lo, hi)`` (``share_window``:
    the same for every M, so one placement serves every call): stage-0 rank p keeps the W1/W3/b1/b3
    columns that its range ``[p*(F-f1)/tp, (p+1)*(F-f1)/tp)`` can cover, ``[p*(F-hi)/tp,
    (p+1)*(F-lo)/tp)``; stage-1 rank t keeps the last ``hi`` columns (its share of the first GEMM is
    the last ``f1`` of them) and W2 / sum(b2) columns ``[t*N/tp, (t+1)*N/tp)``. With tails
    (``window[2]`` = the most tail columns per stage-0 rank), stage-0 rank p also keeps the W2 rows
    its tails can take: the last ``window[2]`` rows before ``(p+1)*(F-f1)/tp``, for any ``f1``."""
    tensors = (w1, b1, w3, b3, w2, b2)
    key = (st.group_name, window,
           *(None if t is None else (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype) for t in tensors))
    hit = _placements.get(key)
    if hit is not None and hit.valid(tensors):
        return hit
    if capturing:
        raise RuntimeError("overlap symm: cta_pipeline_mlp was captured in a CUDA graph before an eager call with "
                           "these weights: run it once eagerly first (the weights are laid out, collectively, "
                           "outside the capture; torch.compile's mode='reduce-overhead' warms up eagerly). Under "
                           "mode='reduce-overhead' the weights must have static addresses (nn.Parameters, or "
                           "torch._dynamo.mark_static_address): other tensor inputs are copied into the graph's "
                           "pool when it is recorded, so they are new tensors there")
    if _placements.pop(key, None) is not None:
        if w1.is_cuda:  # the old layout's memory goes back to the allocator: no kernel may still read it
            torch.cuda.synchronize(w1.device)
        log.info("overlap symm: cta_pipeline_mlp weights changed (version or identity): laying them out again")
    prune_placements()
    placed = symm.persistent(lambda: _lay_out(st, tensors, window), w1.device)
    _placements[key] = placed
    log.info("overlap symm: cta_pipeline_mlp rank %d (stage %d) holds %.1f MiB of re-laid-out weights "
             "(%.1f MiB in all)", st.rank, st.rank // (st.ws // 2), placed.nbytes() / 2**20, placement_bytes() / 2**20)
    return placed


def _lay_out(st: symm.GroupState, tensors, window: tuple[int, int, int]) -> _Placement:
    """The collective part of ``_place``: gather every weight, keep this rank's slices."""
    w1, b1, w3, b3, w2, b2 = tensors
    tp = st.ws // 2
    stage, idx = divmod(st.rank, tp)
    refs = tuple(None if t is None else _storage_ref(t) for t in tensors)
    placed = _Placement(refs, _versions(tensors))
    # Collective (every rank gathers every weight, in the same order), then keep this stage's slice.
    full = {name: (_gather(t, st.group, dim) if t is not None else None)
            for name, t, dim in (("w1", w1, 1), ("b1", b1, 0), ("w3", w3, 1), ("b3", b3, 0), ("w2", w2, 0))}
    b2_sum = None
    if b2 is not None:
        b2_sum = _gather(b2.float().reshape(1, -1), st.group, 0).sum(0)
    F = full["w1"].shape[1]
    lo, hi, tail_max = window
    first = slice(idx * (F - hi) // tp, (idx + 1) * (F - lo) // tp) if stage == 0 else slice(F - hi, F)
    if stage == 0 and tail_max:
        placed.tail_rows = (max(first.start, (idx + 1) * (F - hi) // tp - tail_max), first.stop)
        placed.w2_tail = full["w2"][placed.tail_rows[0]:placed.tail_rows[1]].contiguous()
    if stage == 0 or hi:
        placed.w1 = full["w1"][:, first].contiguous()
        placed.w3 = full["w3"][:, first].contiguous() if w3 is not None else None
        placed.b1 = full["b1"][first].contiguous() if b1 is not None else None
        placed.b3 = full["b3"][first].contiguous() if b3 is not None else None
    if stage == 1:
        ns = w2.shape[1] // tp
        cols = slice(idx * ns, (idx + 1) * ns)
        placed.w2 = full["w2"][:, cols].contiguous()
        placed.b2 = b2_sum[cols].contiguous() if b2_sum is not None else None
    del full
    return placed


def _problem(x, w1, b1, w3, b3, w2, b2, activation, approximate, stages, ws) -> str | None:
    if x.device.type != "cuda":
        return "not a CUDA tensor"
    if (activation, approximate) not in {("gelu", "none"), ("gelu", "tanh"), ("swiglu", "none")}:
        return f"activation {activation!r}/{approximate!r}"
    if stages != 2:
        return f"stages={stages} (the symm kernels pipeline exactly 2 GEMM stages)"
    if ws % 2:
        return f"a group of {ws} ranks (two stages of equal size needed)"
    mats = [("x", x), ("w1", w1), ("w2", w2)] + ([("w3", w3)] if w3 is not None else [])
    for name, t in mats:
        if t.dim() != 2 or t.dtype != x.dtype:
            return f"{name} {tuple(t.shape)} {t.dtype} is not a 2-D {x.dtype} matrix"
    for name, t in (("b1", b1), ("b3", b3), ("b2", b2)):
        if t is not None and (t.dim() != 1 or t.dtype != x.dtype):
            return f"{name} {tuple(t.shape)} {t.dtype} is not a {x.dtype} vector"
    tp = ws // 2
    F, N = w1.shape[1] * ws, w2.shape[1]
    if F % (tp * 128):
        return f"F={F} is not a multiple of {tp * 128} (128 columns per stage-0 rank's tile)"
    if N % tp:
        return f"N={N} does not split over {tp} stage-1 ranks"
    if -(-x.shape[0] // 64) * tp > symm_layout.CTA_ROW_WORDS:
        return f"{x.shape[0]} rows (at most {symm_layout.CTA_ROW_WORDS // tp * 64})"
    return tma_problem(x.dtype, x.shape[1], F, F // tp, N, N // tp)


def _configs(dtype, swiglu: bool, m: int, ns: int, num_sms: int):
    if dtype == torch.float32:
        c0, c1 = STAGE0_CONFIG_FP32[swiglu], STAGE1_CONFIG_FP32
    else:
        c0, c1 = STAGE0_CONFIG[swiglu], STAGE1_CONFIG
    bm = min(c0[0], c1[0])
    tiles_m, tiles_n1 = -(-m // bm), -(-ns // c1[1])
    # A group of row blocks gives stage 1 at most one wave of tiles (all resident at once, walking
    # the group's K-chunks as stage 0 finishes them, in that order), as many as fit; W1 columns are
    # reused from L2 across the group. Groups of equal size: a small last group would leave most
    # SMs idle in the tail (measured: 32 row blocks in groups of 5,...,5,2 vs 8 groups of 4).
    most = max(1, min(tiles_m, num_sms // tiles_n1))
    groups = -(-tiles_m // most)
    group_m = -(-tiles_m // groups)
    return (bm, c0[1], c0[2], group_m, *c0[4:]), (bm, c1[1], c1[2], group_m, *c1[4:])


def _share_unit(tp: int) -> int:
    return math.lcm(256, 128 * tp)  # whole tiles of both stages, split evenly over the stage-0 ranks


def share_window(F: int, tp: int, swiglu: bool) -> tuple[int, int, int]:
    """(lo, hi, tail_max): the stage-1 shares ``f1`` that a call may take (``stage1_share``) and the
    most tail columns per stage-0 rank (``stage0_tail``); the placement keeps the weights for all
    of them, so it does not depend on M."""
    if swiglu:
        f1, hi = _swiglu_share(F, tp), swiglu_tail_share(F, tp)
        lo, top = _swiglu_share_range(F, tp, f1)
        return lo, max(top, hi), (_tail_max(F, tp) if hi else 0)
    unit = _share_unit(tp)
    hi = int(F * GELU_SHARE_MAX) // unit * unit if GELU_FILL_SHARE else 0
    return 0, hi, _tail_max(F, tp)


def _tail_max(F: int, tp: int) -> int:
    return int(F * TAIL_MAX) // tp // 128 * 128 if STAGE0_TAIL else 0


def _swiglu_share(F: int, tp: int) -> int:
    if not STAGE1_SHARE:
        return 0
    unit = _share_unit(tp)
    return (F // (2 * (tp + 1))) // unit * unit


def _swiglu_share_range(F: int, tp: int, base: int) -> tuple[int, int]:
    """The SwiGLU shares ``chunk_plan`` may pick in whole rounds (``SWIGLU_SHARE_ROUNDS``)."""
    if not (SWIGLU_SHARE_ROUNDS and base):
        return base, base
    unit = _share_unit(tp)
    slack = SWIGLU_SHARE_SLACK * unit
    return max(unit, base - slack), min(base + slack, (F - tp * 256) // unit * unit)


def swiglu_share_in_rounds(F: int, N: int, H: int, tp: int, base: int, **shape) -> int:
    """The share in ``_swiglu_share_range`` whose stages' longer one is shortest in ``stage_costs``
    (``H``: twice the hidden size, gate and up), the nearest to ``base`` among equals."""
    lo, hi = _swiglu_share_range(F, tp, base)
    unit = _share_unit(tp)
    return min(range(lo, hi + 1, unit),
               key=lambda f1: (max(stage_costs(F, N, H, tp, f1, 0, **shape)), abs(f1 - base)))


def swiglu_tail_share(F: int, tp: int) -> int:
    """SwiGLU's stage-1 share when stage 0 keeps tails (one row group; 0: no tails). With a tail of
    ``t`` columns per stage-0 rank, the balance of ``stage1_share`` becomes (H = N, first-GEMM
    columns cost 2H, W2 rows N): ``2 (F - f1) / tp + t = 2 f1 + (F - tp t) / tp``, i.e.
    ``f1 = F / (2 (tp + 1)) + tp t / (tp + 1)``; ``t`` about ``SWIGLU_TAIL_FRACTION`` of a stage-0
    rank's columns. ``stage0_tail`` then sizes the tail for the rounded share (any H, N)."""
    base = _swiglu_share(F, tp)
    if not (SWIGLU_TAIL and STAGE0_TAIL and base):
        return 0
    unit = _share_unit(tp)
    t = min(int((F - base) // tp * SWIGLU_TAIL_FRACTION), _tail_max(F, tp))
    return (base + tp * t // (tp + 1) + unit // 2) // unit * unit


def stage1_share(F: int, tp: int, swiglu: bool, tiles_m: int | None = None, bn: int = 256,
                 num_sms: int = 132) -> int:
    """Columns of the first GEMM that every stage-1 rank computes itself (``f1``, the last ones),
    before its own GEMM, which reads them first.

    - **SwiGLU** (balance): its first stage is two GEMMs, its second one; with ``f1`` columns moved,
      stage 0 does ``2 (F - f1) / tp`` and stage 1 ``2 f1 + F / tp`` (in units of H x N GEMM
      columns): equal at ``f1 = F / (2 (tp + 1))`` (more with tails: ``swiglu_tail_share``, which
      ``chunk_plan`` takes where a tail comes out of it).
    - **GELU** (fill): stage 1 would idle until stage 0's first round of tiles (one tile's time,
      about 0.1 ms at H=8192 on an H200) made the first K-chunk. With ``f1`` columns of its own, as
      many as one round of its own tiles of ``tiles_m`` row blocks x ``bn`` columns covers
      (``num_sms // tiles_m`` column tiles), it computes those first and then their part of its GEMM,
      while stage 0's first chunk is made and shipped. Within ``share_window``; 0 without ``tiles_m``.

    Whole units of ``lcm(256, 128 tp)`` columns."""
    if swiglu:
        return _swiglu_share(F, tp)
    lo, hi, _ = share_window(F, tp, False)
    if hi == 0 or tiles_m is None:
        return 0
    unit = _share_unit(tp)
    want = GELU_SHARE_COLS if GELU_SHARE_COLS is not None else (num_sms // tiles_m) * bn
    return max(lo, min(hi, want // unit * unit))


@dataclass(frozen=True)
class ChunkPlan:
    """How one call splits its work (shapes only, so the same on every rank)."""
    cfg0: tuple  # block configs of stage 0 and stage 1
    cfg1: tuple
    tp: int
    tiles_m: int
    groups: int  # row groups
    window: tuple[int, int]  # share_window: what the placement covers
    f1: int  # this call's stage-1 share
    fship: int  # columns each stage-0 rank ships for row group tail_group; the rest of its (F - f1) / tp is its tail
    tail: int
    tail_group: int  # the row group with the tail: the last one
    kchunk: int
    nch: int  # K-chunks per stage-0 rank
    nch1: int  # K-chunks of the stage-1 share

    @property
    def flag_words(self) -> int:
        """Chunk flags per flag region; more than ``symm_layout.CTA_CHUNK_WORDS // 2`` runs on p2p."""
        return self.groups * max(self.tp * self.nch, self.nch1)


def chunk_plan(M: int, F: int, N: int, tp: int, swiglu: bool, dtype, num_sms: int, H: int | None = None) -> ChunkPlan:
    cfg0, cfg1 = _configs(dtype, swiglu, M, N // tp, num_sms)
    tiles_m = -(-M // cfg0[0])
    groups = -(-tiles_m // cfg0[3])
    window = share_window(F, tp, swiglu)
    h = H if H is not None else N
    shape = dict(tiles_m=tiles_m, group_m=cfg0[3], bn0=cfg0[1], bn1=cfg1[1], num_sms=num_sms)
    f1 = stage1_share(F, tp, swiglu, tiles_m, cfg0[1], num_sms)
    if swiglu:
        f1 = swiglu_share_in_rounds(F, N, 2 * h, tp, f1, **shape)
    fp = (F - f1) // tp
    # SwiGLU's tails (one row group) come with their own share; GELU's with any number of groups.
    tail_max = window[2] if groups == 1 or (not swiglu and MULTI_GROUP_TAIL) else 0
    tail = stage0_tail(F, N, 2 * h if swiglu else h, tp, f1, fp, tail_max=tail_max, **shape)
    tail_share = swiglu_tail_share(F, tp) if swiglu else 0
    if groups == 1 and tail_share > f1:  # SwiGLU tails: the larger share, where a tail comes of it
        fp_t = (F - tail_share) // tp
        tail_t = stage0_tail(F, N, 2 * h, tp, tail_share, fp_t, tail_max=tail_max, **shape)
        if tail_t:  # (none when N is well under 2H: the balanced share then)
            f1, fp, tail = tail_share, fp_t, tail_t
    # Chunks cover what the widest group ships: all of fp, but for one group only its shipped part.
    kchunk, nch = k_chunks(fp - tail if groups == 1 else fp, cfg0[1], cfg1[2], groups, tp)
    return ChunkPlan(cfg0, cfg1, tp, tiles_m, groups, window, f1, fp - tail, tail, groups - 1, kchunk, nch,
                     -(-f1 // kchunk))


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
    if TAIL_COLS is not None:
        want = TAIL_COLS
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
    """(chunk width, chunks per stage-0 rank): about ``K_CHUNKS`` chunks of whole stage-0 tiles,
    fewer when the flag region would overflow (``groups`` row groups)."""
    unit = math.lcm(bn0, bk1)
    want = K_CHUNKS
    while True:
        kchunk = -(-(-(-fp // want)) // unit) * unit
        nch = -(-fp // kchunk)
        if groups * tp * nch <= symm_layout.CTA_CHUNK_WORDS // 2 or nch == 1:
            return kchunk, nch
        want = max(1, want // 2)


@register("symm", "cta_pipeline_mlp")
def cta_pipeline_mlp(x, w1, b1, w3, b3, w2, b2, activation, approximate, stages, group_name):
    global _captured
    args = (x, w1, b1, w3, b3, w2, b2, activation, approximate, stages, group_name)
    ws = _group_size(group_name)
    shapes = _shapes(x, w1, b1, w3, b3, w2, b2)
    verdict_key = (shapes, activation, approximate, stages, ws)
    why = _cached(_verdicts, verdict_key,
                  lambda: _problem(x, w1, b1, w3, b3, w2, b2, activation, approximate, stages, ws))
    st = None if why else symm.state(group_name, x.device)
    if st is None:
        return run_on_p2p("cta_pipeline_mlp", why, group_name, *args)
    from ..codegen import cta

    load_kernels()  # the TMA scratch allocator
    PATHS["cta_pipeline_mlp:symm"] += 1
    r, tp = st.rank, ws // 2
    stage, idx = divmod(r, tp)
    M, H = x.shape
    F, N = w1.shape[1] * ws, w2.shape[1]
    out = x.new_empty((M, N))
    if M == 0:
        return out
    swiglu = activation == "swiglu"
    settings = _settings()
    plan_key = (M, F, N, H, tp, swiglu, x.dtype, st.num_sms, settings)
    plan = _cached(_plans, plan_key, lambda: chunk_plan(M, F, N, tp, swiglu, x.dtype, st.num_sms, H=H))
    if plan.flag_words > symm_layout.CTA_CHUNK_WORDS // 2:
        return run_on_p2p("cta_pipeline_mlp", f"{M} rows need more chunk flags than {symm_layout.CTA_CHUNK_WORDS // 2}",
                    group_name, *args)
    graph = torch.cuda.is_current_stream_capturing()
    placed = _place(st, w1, b1, w3, b3, w2, b2, plan.window, graph)
    if EAGER_GRAPHS and not graph and M <= EAGER_GRAPH_MAX_M:
        signature = (plan_key, shapes, activation, approximate, group_name, x.device.index, st.timeout_ns)
        replayed = _eager_replay(signature, placed, x, lambda xs: cta_pipeline_mlp(
            xs, w1, b1, w3, b3, w2, b2, activation, approximate, stages, group_name))
        if replayed is not None:
            return replayed
    cfg0, cfg1, f1, kchunk, nch, nch1 = plan.cfg0, plan.cfg1, plan.f1, plan.kchunk, plan.nch, plan.nch1
    bm, group_m, tiles_m, groups = cfg0[0], cfg0[3], plan.tiles_m, plan.groups
    fp = (F - f1) // tp
    first = placed.first_gemm_weights(stage, idx, tp, F, f1, plan.window[1])
    tail = plan.tail
    es = x.element_size()
    mp = tiles_m * bm
    block_bytes = mp * kchunk * es  # one K-chunk of one stage-0 rank, chunk-major
    y_offset = -(-((tp * nch + nch1) * block_bytes) // 256) * 256
    part_offset = -(-(y_offset + M * N * es) // 256) * 256  # the tails' partial products [tp, M, N/tp]
    need = part_offset + (M * N * es if tail else 0)
    if graph and (st.data is None or st.data.nbytes < need):
        raise RuntimeError("overlap symm: cta_pipeline_mlp was captured in a CUDA graph before an eager call of this "
                           "size: run it once eagerly first (the symmetric buffers grow, collectively, outside the "
                           "capture; torch.compile's mode='reduce-overhead' warms up eagerly)")
    st.ensure_data(need, "cta_pipeline_mlp")
    data, flags = st.peer_tables()
    compute = torch.cuda.current_stream(x.device)
    base = symm_layout.cta_block(graph)
    word = lambda off: st.flag_arg(base + off)  # noqa: E731
    status = st.status_arg()
    epoch_word = word(symm_layout.CTA_EPOCH)
    ready, staged = (word(symm_layout.CTA_READY) if graph else None), TRANSPORT == "ce"
    act = cta.ACTIVATIONS[(activation, approximate)]
    xa = tma_aligned(x)
    stage_buf = _staging_buffer(x, nch * mp * kchunk, "blocks") if stage == 0 and staged else None
    m0 = plan.tail_group * group_m * bm  # the tail's rows: the last row group's
    keep = _staging_buffer(x, (mp - m0) * tail, "tail") if stage == 0 and tail else None
    ship_first = bool(tail) and tp == 1 and SHIP_BEFORE_TAILS
    part = st.data_view(x.dtype, (tp * M * (N // tp),), part_offset) if tail else None

    def gemms():
        if stage == 0:
            cta.launch_stage0(xa, *first, stage_buf, data, flags,
                              word(symm_layout.CTA_COUNTERS), word(symm_layout.CTA_DONE), epoch_word, idx, kchunk, nch,
                              base + symm_layout.CTA_ARRIVED, tp, tp, act, cfg0, st.num_sms, ready=ready, status=status,
                              timeout_ns=st.timeout_ns, rank=r, count_first_at_once=COUNT_FIRST_GROUP_AT_ONCE,
                              fship=plan.fship, keep=keep, tail_group=plan.tail_group, tma_store=STAGE0_TMA_STORE,
                              split_last=STAGE0_SPLIT_LAST)
            return
        a = st.data_view(x.dtype, ((tp * nch + nch1) * mp, kchunk))
        if f1:  # this rank's share of the first GEMM, into its own chunks (read after, in stream order)
            own = a[tp * nch * mp:].view(-1)
            cta.launch_stage0(xa, *first, own, data, flags,
                              word(symm_layout.CTA_COUNTERS), word(symm_layout.CTA_DONE), epoch_word, 0, kchunk, nch1,
                              base + symm_layout.CTA_ARRIVED, tp, tp, act, cfg0, st.num_sms, tma_store=STAGE0_TMA_STORE)
        cta.launch_stage1(a, placed.w2, placed.b2, out, data, flags, y_offset, word(symm_layout.CTA_ARRIVED),
                          word(symm_layout.CTA_Y_COUNTERS), epoch_word, status, st.timeout_ns, r, ws, M, fp, idx,
                          kchunk, nch, base + symm_layout.CTA_Y_DONE, tp, cfg1, st.num_sms, f1=f1, ready=ready,
                          fship=plan.fship,
                          part=part, tail_flags=word(symm_layout.CTA_TAIL_ARRIVED), tail_group=plan.tail_group,
                          ship_before_tail=ship_first)

    def tails():
        """Stage 0: its tail's partial products, into the stage-1 ranks' buffers (stream order: after
        stage 0's kernel wrote ``keep``)."""
        if stage == 0 and tail:
            r0 = (idx + 1) * fp - tail - placed.tail_rows[0]
            cta.launch_tail(keep[:(mp - m0) * tail].view(mp - m0, tail), placed.w2_tail[r0:r0 + tail], data, flags,
                            part_offset, word(symm_layout.CTA_Y_COUNTERS), epoch_word, status, st.timeout_ns, r, M, idx,
                            base + symm_layout.CTA_TAIL_ARRIVED, tp, cfg1, st.num_sms, ready=ready, m0=m0,
                            keep_local=ship_first)

    def collect():
        if stage == 0 or tp > 1:
            y = st.data_view(x.dtype, (M, N), y_offset)
            cta.launch_collect(y, out, word(symm_layout.CTA_Y_DONE), epoch_word, status, st.timeout_ns, r, tp,
                               idx if stage == 1 else -1, bm, part=part if ship_first else None, m0=m0)

    # Every pointer argument is 16-byte aligned (x via tma_aligned, placed weights and views at whole
    # tiles, buffers from the allocator), so the kernel variants follow from this key alone.
    call_key = (plan_key, r, activation, approximate, shapes, x.device.index, st.timeout_ns, graph)
    def preload() -> bool:
        with launcher.preloading():  # compile and load before the stream waits below (codegen/launcher.py)
            gemms()
            tails()
            collect()
        return True

    if not graph:
        _cached(_preloaded_calls, call_key, preload)
    if graph:
        # Inside a captured graph every value baked into the graph repeats on each replay: the epoch
        # is counted on the device (begin_kernel) and READY is raised and awaited by the kernels; the
        # copy engine's pushes see it through their done flags (see _push_blocks).
        st.check_status()
        st.graph_pinned = True  # the graph holds the data buffer's and peer tables' addresses: never freed
        _captured = True  # ... and the staging buffers' (_staging_buffer)
        st.captured_call(compute, finished=False)
        cta.launch_begin(epoch_word, flags, base + symm_layout.CTA_READY, r, ws)
        epoch = None
        if stage_buf is not None:
            st.push_stream.wait_stream(compute)  # after begin_kernel, before stage 0 (not after it)
    else:
        epoch = st.begin(compute, "cta_pipeline_mlp")
        _cuda.write_value32(st.flag_addr(base + symm_layout.CTA_EPOCH), epoch, compute)
        # Stores into peers' buffers (stage 1's Y, stage 0's tiles without the copy engine) wait
        # until they started this call (READY), i.e. stopped reading those buffers in their previous op.
        writes_to = (range(tp, ws) if not staged else ()) if stage == 0 else [p for p in range(ws) if p != r]
        for p in writes_to:
            st.stream_wait(symm_layout.READY + p, epoch, compute)
    gemms()
    if stage_buf is not None:
        _push_blocks(st, stage_buf, epoch, idx, tp, M, mp, bm * group_m, groups, kchunk, nch, es, base,
                     plan.tail_group, plan.fship, fp)
    if stage == 0 and tail and not graph and staged:  # the tails store into the stage-1 ranks' buffers: READY first
        for p in range(tp, ws):
            st.stream_wait(symm_layout.READY + p, epoch, compute)
    tails()
    collect()
    if graph:
        if stage_buf is not None:
            compute.wait_stream(st.push_stream)
        st.stall_if_a_peer_gave_up(compute)
        st.captured_call(compute, finished=True)
    else:
        st.end(compute)
    return out


@dataclass
class _EagerGraph:
    graph: "torch.cuda.CUDAGraph"
    x: Tensor  # the input the graph reads (copied in before each replay)
    out: Tensor  # the output it writes (copied out after)
    placed: _Placement  # the weights' layout it reads: a new layout (weights changed) means a new capture


_eager_graphs: dict[tuple, _EagerGraph] = {}
_eager_calls: dict[tuple, int] = {}


def _eager_replay(signature: tuple, placed: _Placement, x: Tensor, run) -> Tensor | None:
    """``EAGER_GRAPHS``: the call replayed from a graph of ``run`` (the op on a static input),
    captured on the second call of ``signature`` (the first ran eagerly: buffers, weight layout,
    kernels; every rank counts the same calls, so every rank captures the same one). None: run
    this call eagerly."""
    hit = _eager_graphs.get(signature)
    if hit is not None and hit.placed is placed:
        hit.x.copy_(x)
        hit.graph.replay()
        return hit.out.clone()
    calls = _eager_calls[signature] = _eager_calls.get(signature, 0) + 1
    if calls < 2 and hit is None:
        return None
    if len(_eager_graphs) >= EAGER_GRAPHS_KEPT and signature not in _eager_graphs:
        _eager_graphs.pop(next(iter(_eager_graphs)))  # the oldest capture: its pool goes back
    if len(_eager_calls) >= _CACHE_MAX:
        _eager_calls.clear()
    static_x = x.clone(memory_format=torch.contiguous_format)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream(x.device)
    side.wait_stream(torch.cuda.current_stream(x.device))
    with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
        out = run(static_x)
    _eager_graphs[signature] = _EagerGraph(graph, static_x, out, placed)
    graph.replay()
    return out.clone()


def _staging_buffer(x: Tensor, numel: int, what: str) -> Tensor:
    """Stage 0's local buffers (``what``: "blocks", the chunk-major blocks the copy engine ships;
    "tail", its tail of A). Reused: the next call's kernels run after this call's pushes, which
    ``GroupState.end`` orders before anything later on the compute stream."""
    key = (x.device, x.dtype, what)
    buf = _staging.get(key)
    if buf is None or buf.numel() < numel:
        if buf is not None and _captured:  # a captured graph may still use the old one: keep it
            _staging_kept.append(buf)
        elif buf is not None and x.is_cuda:
            torch.cuda.synchronize(x.device)  # the old buffer's memory goes back to the allocator
        buf = _staging[key] = symm.persistent(lambda: torch.empty(numel, dtype=x.dtype, device=x.device), x.device)
    return buf


def _push_blocks(st, stage_buf, epoch, producer, tp, M, mp, group_rows, groups, kchunk, nch, es, base, tail_group,
                 fship, fp):
    """Copy engine: each (row group, K-chunk) block to every stage-1 rank as soon as stage 0's kernel
    raised its local done flag, then raise the consumer's flag; in the order the kernel makes them.
    Row group ``tail_group`` ships ``fship`` of the ``fp`` columns (the rest is its tail).

    ``epoch`` None: a call being captured in a CUDA graph, whose epoch is on the device and whose
    stream waits and writes bake their values in. Each done flag is then awaited for >= 1 and reset
    to 0 right after (the next replay's kernel raises it again: a stream wait for the epoch would
    pass on the previous replay's value), and the consumer's flag is raised by copying the epoch
    word into it behind the block's copy on the same stream. The consumers' READY need no stream
    wait: stage 0's kernel awaited it before raising any done flag."""
    row_bytes = kchunk * es
    src = stage_buf.data_ptr()
    stream = st.push_stream
    for g in range(groups):
        r0 = g * group_rows
        nbytes = (min(M, r0 + group_rows) - r0) * row_bytes
        for j in range(min(nch, -(-(fship if g == tail_group else fp) // kchunk))):
            done = st.flag_addr(base + symm_layout.CTA_DONE + g * nch + j)
            arrived = base + symm_layout.CTA_ARRIVED + (g * tp + producer) * nch + j
            dst, block = ((producer * nch + j) * mp + r0) * row_bytes, src + (j * mp + r0) * row_bytes
            _cuda.wait_value32(done, 1 if epoch is None else epoch, stream)
            if epoch is None:
                _cuda.write_value32(done, 0, stream)
            for q in range(tp):
                if epoch is not None:
                    st.push(tp + q, dst, block, nbytes, arrived)
                else:
                    _cuda.memcpy_async(st.data_addr(tp + q, dst), block, nbytes, stream)
                    _cuda.memcpy_async(st.flag_addr(arrived, tp + q), st.flag_addr(base + symm_layout.CTA_EPOCH), 4,
                                       stream)
