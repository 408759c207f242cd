"""The preconditions the passes' ``check`` methods share: groups, dtypes, shapes, sizes, graph breaks.

Each ``require_*`` returns quietly or raises :class:`~.rejected.Rejected` with the reason.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from ..runtime.checks import REDUCE_OPS
from .fx import RESHAPES, val
from .matmuls import Matmul
from .rejected import Rejected
from .sizes import decide, known_eq

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
GRAPH_BREAK_HINT = "(a graph break between them? torch.compile rewrites within one graph only)"


def crosses_graph_break(node: torch.fx.Node, upstream: bool) -> str:
    """Why a pattern's other half may be in another graph: ``upstream``: ``node`` (what a collective
    reads) is a graph input, directly or through reshapes; else ``node`` (what a collective produced)
    is returned by the graph. "" when neither."""
    if upstream:
        src = node
        while src.op == "call_function" and src.target in RESHAPES:
            src = src.args[0]
        if src.op == "placeholder":
            what = node.name if src is node else f"{node.name} (a reshape of {src.name})"
            return f"{what} is an input of this graph: the matmul that computed it is in another graph {GRAPH_BREAK_HINT}"
        return ""
    if any(u.op == "output" for u in node.users):
        return (f"{node.name} is an output of this graph and no matmul in it reads the value: its consumer is in "
                f"another graph {GRAPH_BREAK_HINT}")
    return ""


def require_group(group_name: Any, group_size: int | None = None) -> int:
    """The size of the (resolvable) group ``group_name``; :class:`Rejected` otherwise."""
    if not isinstance(group_name, str):
        raise Rejected(f"group name {group_name!r} is not a constant string")
    try:
        from torch.distributed.distributed_c10d import _resolve_process_group

        group = _resolve_process_group(group_name)
    except Exception as e:  # noqa: BLE001 - any failure means we do not know the group
        raise Rejected(f"process group {group_name!r} is unknown in this process ({type(e).__name__})") from None
    size = group.size()
    if group_size is not None and size != group_size:
        raise Rejected(f"group {group_name!r} has {size} ranks but the collective says {group_size}")
    if size < 2:
        raise Rejected(f"group {group_name!r} has {size} rank: nothing to overlap")
    return size


def require_dtype(*nodes: torch.fx.Node) -> torch.dtype:
    dtypes = set()
    for n in nodes:
        v = val(n)
        if not isinstance(v, torch.Tensor):
            raise Rejected(f"no tensor metadata on {n.name}")
        dtypes.add(v.dtype)
    if len(dtypes) != 1:
        raise Rejected(f"mixed dtypes {sorted(map(str, dtypes))}")
    (dtype,) = dtypes
    if dtype not in SUPPORTED_DTYPES:
        raise Rejected(f"dtype {dtype} not supported (supported: {', '.join(map(str, SUPPORTED_DTYPES))})")
    return dtype


def require_static(*nodes: torch.fx.Node) -> None:
    """Reject symbolic shapes (passes that do not support them yet)."""
    for n in nodes:
        v = val(n)
        if isinstance(v, torch.Tensor) and any(not isinstance(s, int) for s in v.shape):
            raise Rejected(f"symbolic shape {tuple(v.shape)} on {n.name} (dynamic shapes are not supported by this pass)")


def require_backed(*nodes: torch.fx.Node) -> None:
    """Symbolic sizes are fine as long as the ShapeEnv can decide facts about them: reject
    unbacked (data-dependent) sizes, on which a decision could neither use a hint nor guard."""
    for n in nodes:
        v = val(n)
        if isinstance(v, torch.Tensor) and free_unbacked_symbols(tuple(v.shape)):
            raise Rejected(f"data-dependent (unbacked) size in {tuple(v.shape)} on {n.name}")


def require_bias_vector(mm: Matmul) -> None:
    if mm.bias is None:
        return
    b, out = val(mm.bias), val(mm.node)
    if b is None or b.dim() != 1 or not known_eq(b.shape[0], out.shape[1]):
        raise Rejected(f"addmm bias {mm.bias.name} is not a [N] vector")


def require_min_numel(ctx, numel: Any, *more: Any) -> None:
    """:class:`Rejected` when every given output size is below ``OVERLAP_MIN_NUMEL`` (sizes may be
    symbolic: no ``max`` over SymInts, each comparison decided by :func:`decide`)."""
    if ctx.config.min_numel <= 0:
        return
    numels = (numel, *more)
    if all(decide(n < ctx.config.min_numel) for n in numels):
        shown = numels[0] if len(numels) == 1 else (max(numels) if all(isinstance(n, int) for n in numels) else numels)
        raise Rejected(f"matmul output has {shown} elements < OVERLAP_MIN_NUMEL={ctx.config.min_numel}")


__all__ = ["GRAPH_BREAK_HINT", "REDUCE_OPS", "SUPPORTED_DTYPES", "crosses_graph_break", "require_backed",
           "require_bias_vector", "require_dtype", "require_group", "require_min_numel", "require_static"]
