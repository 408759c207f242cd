"""``overlap::moe_tp_experts`` and ``overlap::moe_tp_experts_backward``: tensor-parallel experts.

In tensor-parallel experts (Hugging Face's ``moe_tp_experts``, Megatron's TP experts) every rank holds
a slice of every expert along the expert width F, so the down projection's rows are partial sums and
the experts' combined output ``[T, H]`` is all-reduced. Between the down GEMM and the all-reduce
there are only operations that are linear per row (a routing weight per row, an un-permutation, the
sum over the top-k slots of each token), so the all-reduce can be cut by tokens: the ops compute the
expert GEMM rows of one band of tokens, reduce that band's top-k sum and start its all-reduce while
the next band computes (``runtime/tp_experts_p2p.py``). The bytes communicated stay ``T x H``.

The backward twin is the experts' input gradient: a grouped GEMM of the result gradients with the
(transposed) gate/up weight, a scatter-add of its rows into their tokens (the gradient of the row
gather), then the all-reduce; it is cut the same way by tokens, and the weight gradient (the
``transformers::grouped_mm_fallback_backward`` form computes it in the same op) runs while the last
band's all-reduce travels.

Which rows belong to which expert, for both ops (``a`` ``[M, K]``, ``w`` ``[E, K, N]``):

- ``offsets`` (``torch._grouped_mm``'s ``offs``: int32/int64 cumulative ends, non-decreasing): row
  ``j`` is expert ``e``'s when ``offsets[e-1] <= j < offsets[e]``; rows ``j >= offsets[-1]`` are 0
  (``transformers::grouped_mm_fallback`` and ``aten._grouped_mm`` both leave them so);
- ``expert_ids`` ``[M]`` (int64): row ``j`` is expert ``expert_ids[j]``'s (transformers'
  ``batched_mm`` form: a ``bmm`` of each row with its expert's gathered weight).

Exactly one of them is given. ``Y[j] = a[j] @ w[e(j)]``.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import checks as _checks
from . import lowering as _lowering
from .checks import OverlapInputError
from .ops import OPS, _define, _fake

TP_REDUCE_OPS = ("sum", "avg", "product", "min", "max")


@_define(
    "moe_tp_experts(Tensor a, Tensor w, Tensor? offsets, Tensor? expert_ids, Tensor? row_mask, Tensor? scale, Tensor? slot_rows, SymInt top_k, str reduce_op, str group_name, str lowering, bool return_rows) -> (Tensor, Tensor)"
)
def moe_tp_experts(
    a: Tensor,
    w: Tensor,
    offsets: Optional[Tensor],
    expert_ids: Optional[Tensor],
    row_mask: Optional[Tensor],
    scale: Optional[Tensor],
    slot_rows: Optional[Tensor],
    top_k: int,
    reduce_op: str,
    group_name: str,
    lowering: str,
    return_rows: bool,
) -> tuple[Tensor, Tensor]:
    """Down projection of tensor-parallel experts, routing-weighted top-k sum, all-reduce.

    ``a`` ``[M, K]``: the expert rows (the activation of this rank's F-slice), ``w`` ``[E, K, N]``:
    this rank's slice of every expert's down weight. Semantics::

        Y = grouped GEMM of a and w (module docstring)            # [M, N]
        Y = where(row_mask, 0, Y)         if row_mask ([M, 1] bool) is given
        R = Y                                                     # returned when return_rows
        Z = Y * scale                     if scale ([M, 1]) is given
        S = Z[slot_rows]                  if slot_rows ([T * top_k] int64) is given, else Z (M = T * top_k)
        out = all_reduce(S.view(T, top_k, N).sum(1), reduce_op)   # [T, N]

    Returns ``(out, R)``; ``R`` is an empty tensor unless ``return_rows``, and with ``return_rows``
    ``slot_rows`` (when given) must be a permutation of ``range(M)``, as the inverse of the sort by
    expert is (every row is computed once, in the band of its token).
    """
    impl = _lowering.implementation(lowering, "moe_tp_experts")
    group = _checks.resolve_group("moe_tp_experts", group_name)
    check_forward(a, w, offsets, expert_ids, row_mask, scale, slot_rows, top_k, reduce_op)
    _checks.check_agreement("moe_tp_experts", group, [
        ("a", a), ("w", w), ("offsets", offsets), ("expert_ids", expert_ids), ("row_mask", row_mask),
        ("scale", scale), ("slot_rows", slot_rows), ("top_k", top_k), ("reduce_op", reduce_op),
        ("return_rows", return_rows)])
    return impl(a, w, offsets, expert_ids, row_mask, scale, slot_rows, top_k, reduce_op, group_name, return_rows)


def _out_dtype(a: Tensor, scale: Optional[Tensor]) -> torch.dtype:
    return a.dtype if scale is None else torch.promote_types(a.dtype, scale.dtype)


@_fake("moe_tp_experts")
def _(a, w, offsets, expert_ids, row_mask, scale, slot_rows, top_k, reduce_op, group_name, lowering, return_rows):
    slots = a.shape[0] if slot_rows is None else slot_rows.shape[0]
    out = a.new_empty((slots // top_k, w.shape[2]), dtype=_out_dtype(a, scale))
    rows = a.new_empty((a.shape[0], w.shape[2])) if return_rows else a.new_empty((0,))
    return out, rows


@_define(
    "moe_tp_experts_backward(Tensor g, Tensor w, Tensor? offsets, Tensor? expert_ids, Tensor? row_mask, Tensor tokens, SymInt num_tokens, Tensor? x, str reduce_op, str group_name, str lowering) -> (Tensor, Tensor)"
)
def moe_tp_experts_backward(
    g: Tensor,
    w: Tensor,
    offsets: Optional[Tensor],
    expert_ids: Optional[Tensor],
    row_mask: Optional[Tensor],
    tokens: Tensor,
    num_tokens: int,
    x: Optional[Tensor],
    reduce_op: str,
    group_name: str,
    lowering: str,
) -> tuple[Tensor, Tensor]:
    """Input gradient of tensor-parallel experts: grouped GEMM, scatter-add into tokens, all-reduce.

    ``g`` ``[M, K]``: the gradient of the expert rows' gate/up GEMM output, ``w`` ``[E, K, N]``: the
    transposed gate/up weight slice, ``tokens`` ``[M]`` int64: the token of each row (in
    ``[0, num_tokens)``). Semantics::

        D = grouped GEMM of g and w (module docstring)            # [M, N]
        D = where(row_mask, 0, D)         if row_mask ([M, 1] bool) is given
        dx = zeros(num_tokens, N).index_put_([tokens], D, accumulate=True)
        dx = all_reduce(dx, reduce_op)                             # [num_tokens, N]
        dw[e] = x[rows of e].T @ g[rows of e]   if x ([M, N]) is given (offsets only), else empty
                                                                   # [E, N, K]; experts without rows: 0

    Returns ``(dx, dw)``.
    """
    impl = _lowering.implementation(lowering, "moe_tp_experts_backward")
    group = _checks.resolve_group("moe_tp_experts_backward", group_name)
    check_backward(g, w, offsets, expert_ids, row_mask, tokens, num_tokens, x, reduce_op)
    _checks.check_agreement("moe_tp_experts_backward", group, [
        ("g", g), ("w", w), ("offsets", offsets), ("expert_ids", expert_ids), ("row_mask", row_mask),
        ("tokens", tokens), ("num_tokens", num_tokens), ("x", x), ("reduce_op", reduce_op)])
    return impl(g, w, offsets, expert_ids, row_mask, tokens, num_tokens, x, reduce_op, group_name)


@_fake("moe_tp_experts_backward")
def _(g, w, offsets, expert_ids, row_mask, tokens, num_tokens, x, reduce_op, group_name, lowering):
    dx = g.new_empty((num_tokens, w.shape[2]))
    dw = g.new_empty((w.shape[0], x.shape[1], g.shape[1])) if x is not None else g.new_empty((0,))
    return dx, dw


OPS["moe_tp_experts"] = torch.ops.overlap.moe_tp_experts
OPS["moe_tp_experts_backward"] = torch.ops.overlap.moe_tp_experts_backward


# ------------------------------------------------------------------------------------- checks
def _fail(op: str, arg: str, msg: str) -> OverlapInputError:
    return OverlapInputError(f"overlap::{op}: argument '{arg}': {msg}")


def _rows_of_experts(op: str, a: Tensor, w: Tensor, offsets, expert_ids, row_mask) -> None:
    if a.dim() != 2 or w.dim() != 3:
        raise _fail(op, "w", f"expected rows [M, K] and weights [E, K, N], got {tuple(a.shape)} and {tuple(w.shape)}")
    if a.shape[1] != w.shape[1]:
        raise _fail(op, "w", f"weights {tuple(w.shape)} do not take rows of {a.shape[1]} columns")
    if a.dtype != w.dtype or not a.is_floating_point():
        raise _fail(op, "w", f"rows {a.dtype} and weights {w.dtype}: expected one floating dtype")
    if a.device != w.device:
        raise _fail(op, "w", f"weights on {w.device}, rows on {a.device}")
    if (offsets is None) == (expert_ids is None):
        raise _fail(op, "offsets", "exactly one of offsets and expert_ids is given")
    if offsets is not None and (offsets.dim() != 1 or offsets.shape[0] != w.shape[0]
                                or offsets.dtype not in (torch.int32, torch.int64)):
        raise _fail(op, "offsets", f"expected [{w.shape[0]}] int32/int64, got {tuple(offsets.shape)} {offsets.dtype}")
    if expert_ids is not None and (tuple(expert_ids.shape) != (a.shape[0],) or expert_ids.dtype != torch.int64):
        raise _fail(op, "expert_ids", f"expected [{a.shape[0]}] int64, got {tuple(expert_ids.shape)} {expert_ids.dtype}")
    if row_mask is not None and (tuple(row_mask.shape) != (a.shape[0], 1) or row_mask.dtype != torch.bool):
        raise _fail(op, "row_mask", f"expected [{a.shape[0]}, 1] bool, got {tuple(row_mask.shape)} {row_mask.dtype}")


def _reduce(op: str, reduce_op: str) -> None:
    if reduce_op not in TP_REDUCE_OPS:
        raise _fail(op, "reduce_op", f"{reduce_op!r}; allowed: {', '.join(TP_REDUCE_OPS)}")


def check_forward(a, w, offsets, expert_ids, row_mask, scale, slot_rows, top_k, reduce_op) -> None:
    op = "moe_tp_experts"
    _rows_of_experts(op, a, w, offsets, expert_ids, row_mask)
    _reduce(op, reduce_op)
    if not isinstance(top_k, int) or top_k < 1:
        raise _fail(op, "top_k", f"expected an int >= 1, got {top_k!r}")
    if scale is not None and (tuple(scale.shape) != (a.shape[0], 1) or not scale.is_floating_point()):
        raise _fail(op, "scale", f"expected [{a.shape[0]}, 1] floating, got {tuple(scale.shape)} {scale.dtype}")
    if slot_rows is not None and (slot_rows.dim() != 1 or slot_rows.dtype != torch.int64):
        raise _fail(op, "slot_rows", f"expected [T * top_k] int64, got {tuple(slot_rows.shape)} {slot_rows.dtype}")
    slots = a.shape[0] if slot_rows is None else slot_rows.shape[0]
    if slots % top_k:
        raise _fail(op, "top_k", f"{slots} slots are not a whole number of tokens of {top_k} slots")


def check_backward(g, w, offsets, expert_ids, row_mask, tokens, num_tokens, x, reduce_op) -> None:
    op = "moe_tp_experts_backward"
    _rows_of_experts(op, g, w, offsets, expert_ids, row_mask)
    _reduce(op, reduce_op)
    if tuple(tokens.shape) != (g.shape[0],) or tokens.dtype != torch.int64:
        raise _fail(op, "tokens", f"expected [{g.shape[0]}] int64, got {tuple(tokens.shape)} {tokens.dtype}")
    if not isinstance(num_tokens, int) or num_tokens < 0:
        raise _fail(op, "num_tokens", f"expected an int >= 0, got {num_tokens!r}")
    if x is not None:
        if offsets is None:
            raise _fail(op, "x", "the weight gradient is computed in the offsets form only")
        if x.dim() != 2 or x.shape[0] != g.shape[0] or x.shape[1] != w.shape[2] or x.dtype != g.dtype:
            raise _fail(op, "x", f"expected [{g.shape[0]}, {w.shape[2]}] {g.dtype}, got {tuple(x.shape)} {x.dtype}")


# ------------------------------------------------------------------------------ symm lowering
SYMM_WHY = "no symmetric-memory kernel for tensor-parallel experts yet: the p2p token bands run instead"


def _register_symm() -> None:
    from .lowering import register
    from .symm.lowering_helpers import run_on_p2p

    @register("symm", "moe_tp_experts")
    def _forward(*args):
        return run_on_p2p("moe_tp_experts", SYMM_WHY, args[9], *args)

    @register("symm", "moe_tp_experts_backward")
    def _backward(*args):
        return run_on_p2p("moe_tp_experts_backward", SYMM_WHY, args[9], *args)


_register_symm()
