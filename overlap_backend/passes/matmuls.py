"""The matmuls the passes rewrite: ``mm`` / ``addmm`` (possibly behind one reshape), and sums of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from .fx import RESHAPES, aten, val
from .sizes import known_eq, prod


@dataclass
class Matmul:
    """``mm(a, b)`` or ``addmm(bias, a, b)`` (beta = alpha = 1)."""

    node: torch.fx.Node
    a: torch.fx.Node
    b: torch.fx.Node
    bias: torch.fx.Node | None


def as_matmul(node: Any) -> Matmul | None:
    if not isinstance(node, torch.fx.Node):
        return None
    if node.target is aten.mm.default:
        return Matmul(node, node.args[0], node.args[1], None)
    if node.target is aten.addmm.default:
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            return None
        return Matmul(node, node.args[1], node.args[2], node.args[0])
    return None


def is_flatten_to_2d(node: torch.fx.Node) -> bool:
    """A reshape of an N-D tensor to ``[prod(leading dims), last dim]`` (symbolically: no guard)."""
    if node.target not in RESHAPES:
        return False
    src, out = val(node.args[0]), val(node)
    if src is None or out is None or out.dim() != 2 or src.dim() < 1:
        return False
    return known_eq(out.shape[1], src.shape[-1]) and known_eq(out.shape[0], prod(src.shape[:-1]))


def producer_matmul(node: torch.fx.Node) -> tuple[Matmul | None, torch.fx.Node | None]:
    """The matmul whose result ``node`` is, possibly through one reshape; and that reshape."""
    if (mm := as_matmul(node)) is not None:
        return mm, None
    if node.target in RESHAPES and (mm := as_matmul(node.args[0])) is not None:
        return mm, node
    return None, None


def producer_matmul_sum(
    node: torch.fx.Node,
) -> tuple[list[tuple[Matmul, torch.fx.Node | None]], list[torch.fx.Node]] | None:
    """``node`` as a sum of matmuls: ``add(add(mm_q, mm_k), mm_v)``, each term a matmul or one
    reshape of one (the input gradient of projections that read the same tensor: Q/K/V, SwiGLU's
    w1/w3). Inductor's post-grad ``addmm`` fusion may have folded one add into its matmul:
    ``addmm(mm_q, a_k, b_k)``, a "bias" of the matmul's full ``[M, N]`` shape, counts as
    ``mm_q + a_k @ b_k``. Returns the terms ``[(matmul, reshape or None)]`` in order and the
    ``add`` nodes; None unless ``node`` is such a sum with at least two terms."""
    if not isinstance(node, torch.fx.Node):
        return None
    if node.target is aten.addmm.default:
        mm = as_matmul(node)
        if mm is None or not isinstance(mm.bias, torch.fx.Node) or _is_vector_bias(mm):
            return None
        inner = _matmul_terms(mm.bias)
        if inner is None:
            return None
        return inner[0] + [(Matmul(node, mm.a, mm.b, None), None)], inner[1]
    if node.target is not aten.add.Tensor or node.kwargs.get("alpha", 1) != 1 or len(node.args) != 2:
        return None
    terms, adds = [], [node]
    for operand in node.args:
        inner = _matmul_terms(operand)
        if inner is None:
            return None
        terms += inner[0]
        adds += inner[1]
    return terms, adds


def _matmul_terms(node: Any) -> tuple[list[tuple[Matmul, torch.fx.Node | None]], list[torch.fx.Node]] | None:
    """One term (a bias-free matmul, possibly reshaped) or a sum of them."""
    if not isinstance(node, torch.fx.Node):
        return None
    mm, reshape = producer_matmul(node)
    if mm is not None and (mm.bias is None or _is_vector_bias(mm)):
        return [(mm, reshape)], []
    return producer_matmul_sum(node)


def _is_vector_bias(mm: Matmul) -> bool:
    b = val(mm.bias)
    return b is None or b.dim() <= 1
