"""The weight placement of ``cta_pipeline_mlp`` on ``symm``: each rank's copy of the columns (and
rows) its stage uses, laid out once per weight version, collectively (docs/cta.md).

The op receives tensor-parallel shards (``w1``/``w3``: [H, F/ws] columns, ``w2``: [F/ws, N] rows).
Once per weight version it gathers them and keeps, on stage-0 rank ``p``, the columns
``[p*F/tp, (p+1)*F/tp)`` of W1 (and W3, b1, b3), and on stage-1 rank ``t`` the columns
``[t*N/tp, (t+1)*N/tp)`` of W2 and of ``sum_r b2_r``, widened to every share and tail a call may
take (``cta_plan.share_window``). That costs, per rank, one extra copy of the weight its stage uses
(logged; ``placement_bytes()``): the user's shards stay where they are. The cache is keyed by the
weights' identities and invalidated when any of them changes (``Tensor._version``, which in-place
optimiser steps bump on every rank alike).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor
from torch.multiprocessing.reductions import StorageWeakRef

from . import symm

log = logging.getLogger("overlap_backend.symm")


@dataclass
class Placement:
    refs: tuple
    versions: tuple
    w1: Tensor | None = None  # stage 0: [H, F/tp]
    b1: Tensor | None = None
    w3: Tensor | None = None
    b3: Tensor | None = None
    w2: Tensor | None = None  # stage 1: [F, N/tp]
    b2: Tensor | None = None  # stage 1: [N/tp] float32, the sum of every rank's b2
    b2_lowp: Tensor | None = None  # stage 1: b2 in the weights' dtype (the cuBLAS form's addmm bias)
    w2_tail: Tensor | None = None  # stage 0: the W2 rows [tail_rows[0], tail_rows[1]) its tails can take, [., N]
    tail_rows: tuple[int, int] = (0, 0)
    first_views: dict = field(default_factory=dict)  # first_gemm_weights, per share

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.w1, self.b1, self.w3, self.b3, self.w2, self.b2,
                                                          self.b2_lowp, self.w2_tail) if t is not None)

    def first_gemm_weights(self, stage: int, idx: int, tp: int, F: int, f1: int, hi: int) -> tuple:
        """(w1, b1, w3, b3) of a call's part of the first GEMM, views into this placement (which
        covers every share up to ``hi``, see ``place``): stage-0 rank ``idx``'s columns
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
        return all((r is None and t is None) or (r is not None and t is not None and same_storage(r, t))
                   for r, t in zip(self.refs, tensors)) and self.versions == versions(tensors)


placements: dict[tuple, Placement] = {}


def prune_placements() -> int:
    """Drop the placements of weights that no longer exist (a model that was freed, the old weights
    of a reloaded one): their keys can never match again, and each holds a copy of a weight.
    Returns the number dropped. Placements of live weights (any shape of ``x``, any compiled graph
    that calls the op with them) are kept and reused."""
    dead = [k for k, p in placements.items() if any(r is not None and r.expired() for r in p.refs)]
    for k in dead:
        del placements[k]
    return len(dead)


def placement_bytes() -> int:
    """Memory held by the re-laid-out weights of this process."""
    return sum(p.nbytes() for p in placements.values())


def versions(tensors) -> tuple:
    return tuple(t._version if t is not None else -1 for t in tensors)  # a view shares its base's counter


def storage_ref(t: Tensor) -> StorageWeakRef:
    """A weak reference to the storage that holds ``t``. Graphs pass weights as fresh views every call
    (``w.t()``, Inductor's ``reinterpret_tensor``, whose ``_base`` is not the parameter), so a
    placement is tied to the storage, not to a tensor object. While the weak reference lives, the
    storage's control block is not freed, so a live storage at the same address is the same one."""
    return StorageWeakRef(t.untyped_storage())


def same_storage(ref: StorageWeakRef, t: Tensor) -> bool:
    return not ref.expired() and ref.cdata == t.untyped_storage()._cdata


def gather(t: Tensor, group, dim: int) -> Tensor:
    parts = [torch.empty_like(t, memory_format=torch.contiguous_format) for _ in range(group.size())]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.cat(parts, dim)


def place(st: symm.GroupState, w1, b1, w3, b3, w2, b2, window: tuple[int, int, int],
          capturing: bool = False) -> Placement:
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
    hit = placements.get(key)
    if hit is not None and hit.valid(tensors):
        return hit
    if capturing:
        raise RuntimeError("overlap symm: cta_pipeline_mlp was captured in a CUDA graph before an eager call with "
                           "these weights: run it once eagerly first (the weights are laid out, collectively, "
                           "outside the capture; torch.compile's mode='reduce-overhead' warms up eagerly). Under "
                           "mode='reduce-overhead' the weights must have static addresses (nn.Parameters, or "
                           "torch._dynamo.mark_static_address): other tensor inputs are copied into the graph's "
                           "pool when it is recorded, so they are new tensors there")
    if placements.pop(key, None) is not None:
        if w1.is_cuda:  # the old layout's memory goes back to the allocator: no kernel may still read it
            torch.cuda.synchronize(w1.device)
        log.info("overlap symm: cta_pipeline_mlp weights changed (version or identity): laying them out again")
    prune_placements()
    placed = symm.persistent(lambda: _lay_out(st, tensors, window), w1.device)
    placements[key] = placed
    log.info("overlap symm: cta_pipeline_mlp rank %d (stage %d) holds %.1f MiB of re-laid-out weights "
             "(%.1f MiB in all)", st.rank, st.rank // (st.ws // 2), placed.nbytes() / 2**20, placement_bytes() / 2**20)
    return placed


def _lay_out(st: symm.GroupState, tensors, window: tuple[int, int, int]) -> Placement:
    """The collective part of ``place``: gather every weight, keep this rank's slices."""
    w1, b1, w3, b3, w2, b2 = tensors
    tp = st.ws // 2
    stage, idx = divmod(st.rank, tp)
    refs = tuple(None if t is None else storage_ref(t) for t in tensors)
    placed = Placement(refs, versions(tensors))
    # Collective (every rank gathers every weight, in the same order), then keep this stage's slice.
    full = {name: (gather(t, st.group, dim) if t is not None else None)
            for name, t, dim in (("w1", w1, 1), ("b1", b1, 0), ("w3", w3, 1), ("b3", b3, 0), ("w2", w2, 0))}
    b2_sum = None
    if b2 is not None:
        b2_sum = gather(b2.float().reshape(1, -1), st.group, 0).sum(0)
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
        placed.b2_lowp = placed.b2.to(w2.dtype) if b2_sum is not None else None
    del full
    return placed
