"""Symbolic sizes in the passes.

Sizes may be SymInts (``dynamic=True``, ``mark_dynamic``). Facts about them are decided in two ways:
``known_*`` holds for every value of the symbols (no guard: e.g. the gathered dim is ``ws * s0``
by construction); ``decide`` installs a ShapeEnv guard when the fact is not known either way, so
that an input for which it would change recompiles. Neither ever depends on the rank.
"""

from __future__ import annotations

import contextvars
import operator
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import guard_or_false, statically_known_true

from ..spec import knobs
from .fx import aten, val
from .rejected import Rejected


def prod(sizes) -> Any:
    out = 1
    for s in sizes:
        out = out * s
    return out


def size_value(x: Any) -> Any:
    """A size argument of a node (int, SymInt or the node that computes a SymInt) as int/SymInt."""
    return val(x) if isinstance(x, torch.fx.Node) else x


def known_true(cond: Any) -> bool:
    """``cond`` holds for all values of the symbols (no guard installed)."""
    return bool(cond) if isinstance(cond, bool) else statically_known_true(cond)


def known_eq(a: Any, b: Any) -> bool:
    a, b = size_value(a), size_value(b)
    if a is None or b is None:
        return False
    return known_true(a == b)


# False while a backward graph is transformed: AOTAutograd may compile it lazily (at the first
# backward call), after Dynamo has fixed the frame's guards, so a guard installed then would not
# protect the reuse of the graph. Set by ``PassManager.run``.
GUARDS_ALLOWED: contextvars.ContextVar[bool] = contextvars.ContextVar("overlap_guards_allowed", default=True)


def decide(cond: Any) -> bool:
    """``cond`` for this graph: statically when possible, else by the hint with a guard on the
    result (backed sizes), so the compiled graph is only reused where the decision stands.
    Undecidable (unbacked) conditions count as False: the caller rejects. Where guards are not
    allowed (backward graphs), a condition that is not known either way is :class:`Rejected`."""
    if isinstance(cond, bool):
        return cond
    if statically_known_true(cond):
        return True
    if statically_known_true(torch.sym_not(cond)):
        return False
    if not GUARDS_ALLOWED.get():
        raise Rejected(f"{cond} is not known for every size, and no guard is installed in a backward graph")
    return guard_or_false(cond)


def sym_node(graph: torch.fx.Graph, value: Any, before: torch.fx.Node, create: bool) -> Any:
    """An int, or a node (existing, or created before ``before`` when ``create``) whose value is the
    SymInt ``value``; None when the graph has nothing to compute it from."""
    import sympy

    if not isinstance(value, torch.SymInt):
        return value
    expr = value.node.expr
    if expr.is_number:
        return int(expr)
    order = {n: i for i, n in enumerate(graph.nodes)}
    limit = order[before]
    tensors = []
    for n in graph.nodes:
        if order[n] >= limit:
            break
        v = val(n)
        if isinstance(v, torch.SymInt) and v.node.expr == expr:
            return n
        if isinstance(v, torch.Tensor):
            tensors.append((n, v))
    for n, v in tensors:
        for d, s in enumerate(v.shape):
            if isinstance(s, torch.SymInt) and s.node.expr == expr:
                if not create:
                    return n
                with graph.inserting_before(before):
                    node = graph.call_function(aten.sym_size.int, (n, d))
                node.meta["val"] = s
                return node
    # a sum or product of sizes the graph has (e.g. ``4 * s0`` from ``s0``)
    combine = {sympy.Mul: operator.mul, sympy.Add: operator.add}.get(type(expr))
    if combine is None:
        return None
    shape_env = value.node.shape_env
    parts = []
    for term in expr.args:
        sub = int(term) if term.is_number else shape_env.create_symintnode(term, hint=None)
        node = sym_node(graph, sub, before, create)
        if node is None:
            return None
        parts.append(node)
    if not create:
        return parts[0]
    acc = parts[0]
    for p in parts[1:]:
        with graph.inserting_before(before):
            nxt = graph.call_function(combine, (acc, p))
        nxt.meta["val"] = combine(size_value(acc), size_value(p))
        acc = nxt
    return acc


def require_sizes_available(graph: torch.fx.Graph, sizes, before: torch.fx.Node) -> None:
    """:class:`Rejected` unless every symbolic size of ``sizes`` can be computed in the graph."""
    for s in sizes:
        if sym_node(graph, s, before, create=False) is None:
            raise Rejected(f"symbolic size {s} cannot be computed from the graph's values")


def size_args(graph: torch.fx.Graph, sizes, before: torch.fx.Node) -> list[Any]:
    """``sizes`` as node arguments: ints stay, SymInts become nodes that compute them (created
    before ``before`` where the graph has none)."""
    out = []
    for s in sizes:
        node = sym_node(graph, s, before, create=True)
        if node is None:
            raise AssertionError(f"symbolic size {s} cannot be computed from the graph's values")
        out.append(node)
    return out


def hint(size: Any, fallback: int | None = None) -> int:
    """An int for the cost model: ``size`` itself, or the hint of a symbolic size (the example
    input's value, the same on every rank of an SPMD program). Never guards: the model's choice is
    a heuristic, not a precondition. Unbacked sizes have no hint: ``fallback``
    (``knobs.passes.UNBACKED_SIZE_HINT`` by default)."""
    if fallback is None:
        fallback = knobs.passes.UNBACKED_SIZE_HINT
    if isinstance(size, int):
        return size
    node = getattr(size, "node", None)
    value = getattr(node, "hint", None)
    if value is None and node is not None:
        env = node.shape_env
        try:  # optimization_hint where it exists (torch >= 2.13 deprecates size_hint), else size_hint
            if hasattr(env, "optimization_hint"):
                value = env.optimization_hint(node.expr, fallback=fallback)
            else:
                value = env.size_hint(node.expr, allow_none=True)
        except Exception:  # noqa: BLE001 - no hint: the fallback
            value = None
    try:
        return int(value) if value is not None else fallback
    except (TypeError, ValueError):
        return fallback
