"""The ``torch.ops.overlap`` custom ops: schema, exact semantics, fake implementation, dispatch.

Each rewrite in ``passes/`` replaces the matched subgraph by ONE of these ops. An op's real
implementation is looked up in the lowering registry by the ``lowering`` argument, which the pass
resolved at compile time (identically on every rank), so the graph says how it will run.

Shapes below: ``ws`` is the size of the process group named by ``group_name``.
"""

import math
from typing import Optional

import torch
from torch import Tensor

from . import lowering as _lowering

REDUCE_OPS = ("sum", "avg", "product", "min", "max")


def _flat_rows(shape) -> int:
    return math.prod(shape[:-1])


# --------------------------------------------------------------------------------------- ag_mm
@torch.library.custom_op("overlap::ag_mm", mutates_args=())
def ag_mm(
    shard: Tensor,
    weights: list[Tensor],
    biases: list[Optional[Tensor]],
    gather_dim: int,
    group_name: str,
    lowering: str,
    return_gathered: bool,
) -> tuple[Tensor, list[Tensor]]:
    """All-gather then matmul(s), with the gather decomposed so each step's matmul overlaps it.

    Semantics, with ``G = all_gather(shard, dim=gather_dim)`` (rank r's shard is r-th along
    ``gather_dim``, as ``funcol.all_gather_tensor`` gives) and ``K = G.shape[-1]``::

        outs[i] = G.reshape(-1, K) @ weights[i]  (+ biases[i] when not None)   # [prod(G.shape[:-1]), N_i]
        gathered = G if return_gathered else an empty tensor

    ``gather_dim`` may be the last dim (the contraction dim is gathered: the matmul becomes a sum
    of per-chunk partial products). ``weights[i]`` is ``[K, N_i]``; ``biases[i]`` is ``[N_i]``.
    """
    impl = _lowering.implementation(lowering, "ag_mm")
    return impl(shard, weights, biases, gather_dim, group_name, return_gathered)


@ag_mm.register_fake
def _(shard, weights, biases, gather_dim, group_name, lowering, return_gathered):
    ws = _group_size(group_name)
    dim = gather_dim % shard.dim()
    gshape = list(shard.shape)
    gshape[dim] *= ws
    rows = _flat_rows(gshape)
    outs = [shard.new_empty((rows, w.shape[1])) for w in weights]
    gathered = shard.new_empty(gshape) if return_gathered else shard.new_empty((0,))
    return gathered, outs


# --------------------------------------------------------------------------------------- mm_rs
@torch.library.custom_op("overlap::mm_rs", mutates_args=())
def mm_rs(
    a: Tensor,
    b: Tensor,
    bias: Optional[Tensor],
    out_shape: list[int],
    scatter_dim: int,
    reduce_op: str,
    group_name: str,
    lowering: str,
) -> Tensor:
    """Matmul then reduce-scatter, decomposed so that no communication follows the last compute.

    Semantics: ``C = (a @ b + bias).view(out_shape)`` (``a`` is ``[M, K]``, ``b`` ``[K, N]``,
    ``prod(out_shape[:-1]) == M``, ``out_shape[-1] == N``); returns
    ``reduce_scatter(C, reduce_op, dim=scatter_dim)``: the ``rank``-th of ``ws`` equal chunks of C
    along ``scatter_dim``, reduced over ranks (``funcol.reduce_scatter_tensor``'s semantics).
    """
    impl = _lowering.implementation(lowering, "mm_rs")
    return impl(a, b, bias, out_shape, scatter_dim, reduce_op, group_name)


@mm_rs.register_fake
def _(a, b, bias, out_shape, scatter_dim, reduce_op, group_name, lowering):
    ws = _group_size(group_name)
    shape = list(out_shape)
    dim = scatter_dim % len(shape)
    shape[dim] //= ws
    return a.new_empty(shape, dtype=torch.result_type(a, b))


# --------------------------------------------------------------------------------------- mm_ar
@torch.library.custom_op("overlap::mm_ar", mutates_args=())
def mm_ar(
    a: Tensor,
    b: Tensor,
    bias: Optional[Tensor],
    reduce_op: str,
    group_name: str,
    lowering: str,
) -> Tensor:
    """Matmul then all-reduce: a fused reduce-scatter (as ``mm_rs``, over row chunks), then an
    all-gather of the reduced chunks.

    Semantics: ``all_reduce(a @ b + bias, reduce_op)``, shape ``[M, N]``.
    """
    impl = _lowering.implementation(lowering, "mm_ar")
    return impl(a, b, bias, reduce_op, group_name)


@mm_ar.register_fake
def _(a, b, bias, reduce_op, group_name, lowering):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=torch.result_type(a, b))


def _group_size(group_name: str) -> int:
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(group_name).size()


OPS = {"ag_mm": ag_mm, "mm_rs": mm_rs, "mm_ar": mm_ar}
