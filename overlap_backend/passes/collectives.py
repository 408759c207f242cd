"""The collective patterns the passes start from: all-gather, reduce-scatter, all-reduce.

Everything named ``find_*`` only looks at the graph. The patterns are written with Inductor's own
matcher (``torch._inductor.pattern_matcher``); the slice/cat forms that AOTAutograd's backward
produces are matched by hand (a variable-length list of slices of one node is not expressible with
``ListOf`` alone). ``gather_layout_error`` / ``scatter_layout_error`` check that a split/cat around a
dim-0 collective is the collective along another dim; ``forward_collective_copies`` normalises the
functionalized in-place forms before the passes look.
"""

from __future__ import annotations

import operator
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch._inductor.pattern_matcher import MULTIPLE, CallFunction, Ignored, KeywordArg, ListOf, Match

from .fx import SPLITS, aten, arg, c10d, val
from .sizes import decide, known_eq


def _wait_of(collective_pattern):
    return CallFunction(c10d.wait_tensor.default, collective_pattern)


def _all_gather(shard):
    return _wait_of(
        CallFunction(c10d.all_gather_into_tensor.default, shard, KeywordArg("group_size"), KeywordArg("group_name"))
    )


# funcol.all_gather_tensor(x, gather_dim=0): wait(all_gather_into_tensor(x))
_AG_DIM0 = _all_gather(KeywordArg("shard"))
# gather_dim > 0: the dim-0 gather is split into ws chunks that are concatenated along gather_dim.
_AG_SPLIT_CAT = CallFunction(
    aten.cat.default,
    ListOf(
        CallFunction(
            operator.getitem,
            CallFunction(SPLITS, _all_gather(KeywordArg("shard")), Ignored(), _users=MULTIPLE),
            Ignored(),
        )
    ),
    KeywordArg("gather_dim"),
)


def _reduce_scatter(inp, users: int):
    return _wait_of(
        CallFunction(
            c10d.reduce_scatter_tensor.default,
            inp,
            KeywordArg("reduce_op"),
            KeywordArg("group_size"),
            KeywordArg("group_name"),
            _users=users,
        )
    )


def _rs_split_cat(users: int):
    # scatter_dim > 0: chunks along scatter_dim are concatenated along dim 0 before the scatter.
    return _reduce_scatter(
        CallFunction(
            aten.cat.default,
            ListOf(
                CallFunction(
                    operator.getitem,
                    CallFunction(SPLITS, KeywordArg("input"), Ignored(), KeywordArg("scatter_dim"), _users=MULTIPLE),
                    Ignored(),
                )
            ),
        ),
        users,
    )


# Two users of the reduce_scatter node happen when its result is also saved for backward.
_RS_PATTERNS = [
    (_rs_split_cat(1), True),
    (_rs_split_cat(2), True),
    (_reduce_scatter(KeywordArg("input"), 1), False),
    (_reduce_scatter(KeywordArg("input"), 2), False),
]

_ALL_REDUCE = _wait_of(
    CallFunction(c10d.all_reduce.default, KeywordArg("input"), KeywordArg("reduce_op"), KeywordArg("group_name"))
)


@dataclass
class AllGather:
    nodes: list[torch.fx.Node]  # every node of the gather, collective first
    shard: torch.fx.Node
    collective: torch.fx.Node
    result: torch.fx.Node  # the node whose value is the gathered tensor
    gather_dim: int
    group_size: int
    group_name: str


@dataclass
class ReduceScatter:
    nodes: list[torch.fx.Node]
    input: torch.fx.Node  # the tensor that is reduce-scattered, before any split/cat
    collective: torch.fx.Node
    wait: torch.fx.Node
    scatter_dim: int
    reduce_op: str
    group_size: int
    group_name: str


@dataclass
class AllReduce:
    nodes: list[torch.fx.Node]
    input: torch.fx.Node
    collective: torch.fx.Node
    wait: torch.fx.Node
    reduce_op: str
    group_name: str


def _from_match(m: Match) -> list[torch.fx.Node]:
    return [n for n in m.nodes if isinstance(n, torch.fx.Node)]


def _match_slice_cat_all_gather(node: torch.fx.Node) -> AllGather | None:
    """``cat([slice(wait(ag), 0, i*s, (i+1)*s) for i], gather_dim)``, as AOT backward emits it."""
    if node.target is not aten.cat.default:
        return None
    inputs = arg(node, 0, "tensors")
    gather_dim = arg(node, 1, "dim", 0)
    if not isinstance(inputs, (list, tuple)) or not inputs or not isinstance(gather_dim, int):
        return None
    wait = None
    for inp in inputs:
        if not (isinstance(inp, torch.fx.Node) and inp.target is aten.slice.Tensor and arg(inp, 1, "dim", 0) == 0):
            return None
        src = inp.args[0]
        if not (isinstance(src, torch.fx.Node) and src.target is c10d.wait_tensor.default):
            return None
        if wait is not None and src is not wait:
            return None
        wait = src
    ag = wait.args[0]
    if not (isinstance(ag, torch.fx.Node) and ag.target is c10d.all_gather_into_tensor.default):
        return None
    return AllGather(
        nodes=[ag, wait, *inputs, node],
        shard=ag.args[0],
        collective=ag,
        result=node,
        gather_dim=gather_dim,
        group_size=arg(ag, 1, "group_size"),
        group_name=arg(ag, 2, "group_name"),
    )


def find_all_gathers(graph: torch.fx.Graph) -> list[AllGather]:
    """Every all-gather in ``graph`` with the node that holds its gathered value."""
    found: dict[torch.fx.Node, AllGather] = {}
    # Walk backwards so that the longer (split/cat) form claims its collective before the dim-0 form.
    for node in reversed(graph.nodes):
        if node.target is aten.cat.default:
            ag = _match_slice_cat_all_gather(node)
            if ag is None and (m := _AG_SPLIT_CAT.match(node)):
                nodes = _from_match(m)
                coll = next(n for n in nodes if n.target is c10d.all_gather_into_tensor.default)
                ag = AllGather(
                    nodes=nodes, shard=m.kwargs["shard"], collective=coll, result=node,
                    gather_dim=m.kwargs["gather_dim"], group_size=m.kwargs["group_size"],
                    group_name=m.kwargs["group_name"],
                )
            if ag is not None and ag.collective not in found:
                found[ag.collective] = ag
        elif node.target is c10d.wait_tensor.default and (m := _AG_DIM0.match(node)):
            coll = node.args[0]
            if coll not in found:
                found[coll] = AllGather(
                    nodes=_from_match(m), shard=m.kwargs["shard"], collective=coll, result=node,
                    gather_dim=0, group_size=m.kwargs["group_size"], group_name=m.kwargs["group_name"],
                )
    for ag in found.values():
        # a no-op slice (DTensor's un-padding with dynamic shapes) is the gathered value itself
        while len(ag.result.users) == 1 and is_noop_slice(slice_node := next(iter(ag.result.users))):
            ag.nodes.append(slice_node)
            ag.result = slice_node
    order = {n: i for i, n in enumerate(graph.nodes)}
    return sorted(found.values(), key=lambda ag: order[ag.collective])


def is_noop_slice(node: Any) -> bool:
    """``aten.slice(x, dim, 0, end, 1)`` whose ``end`` covers all of ``x``'s ``dim`` (``end >= size``,
    e.g. ``sys.maxsize``): the identity, a view of all of ``x``."""
    if not (isinstance(node, torch.fx.Node) and node.target is aten.slice.Tensor):
        return False
    src = node.args[0]
    if not isinstance(src, torch.fx.Node) or not isinstance(val(src), torch.Tensor):
        return False
    size_dims = val(src).dim()
    dim = arg(node, 1, "dim", 0)
    if not isinstance(dim, int) or not -size_dims <= dim < size_dims:
        return False
    start, end, step = arg(node, 2, "start", None), arg(node, 3, "end", None), arg(node, 4, "step", 1)
    if start not in (None, 0) or step != 1:
        return False
    size = val(src).shape[dim]
    if end is None or (isinstance(end, int) and isinstance(size, int) and end >= size):
        return True
    if isinstance(end, int) and end >= sys.maxsize:
        return True
    return known_eq(end, size)


def _match_slice_cat_reduce_scatter(wait: torch.fx.Node) -> ReduceScatter | None:
    """``reduce_scatter(cat([slice(x, d, ...) for i]))``, as AOT backward emits it."""
    rs = wait.args[0]
    if not (isinstance(rs, torch.fx.Node) and rs.target is c10d.reduce_scatter_tensor.default):
        return None
    cat = rs.args[0]
    if not (isinstance(cat, torch.fx.Node) and cat.target is aten.cat.default and arg(cat, 1, "dim", 0) == 0):
        return None
    src, dim = None, None
    for inp in cat.args[0]:
        if not (isinstance(inp, torch.fx.Node) and inp.target is aten.slice.Tensor):
            return None
        if src is not None and (inp.args[0] is not src or arg(inp, 1, "dim", 0) != dim):
            return None
        src, dim = inp.args[0], arg(inp, 1, "dim", 0)
    if src is None:
        return None
    return ReduceScatter(
        nodes=[*cat.args[0], cat, rs, wait], input=src, collective=rs, wait=wait, scatter_dim=dim,
        reduce_op=arg(rs, 1, "reduce_op"), group_size=arg(rs, 2, "group_size"), group_name=arg(rs, 3, "group_name"),
    )


def find_reduce_scatters(graph: torch.fx.Graph) -> list[ReduceScatter]:
    found = []
    for node in graph.nodes:
        if node.target is not c10d.wait_tensor.default:
            continue
        rs = _match_slice_cat_reduce_scatter(node)
        if rs is None:
            for pattern, has_split in _RS_PATTERNS:
                if m := pattern.match(node):
                    nodes = _from_match(m)
                    coll = next(n for n in nodes if n.target is c10d.reduce_scatter_tensor.default)
                    rs = ReduceScatter(
                        nodes=nodes, input=m.kwargs["input"], collective=coll, wait=node,
                        scatter_dim=m.kwargs["scatter_dim"] if has_split else 0, reduce_op=m.kwargs["reduce_op"],
                        group_size=m.kwargs["group_size"], group_name=m.kwargs["group_name"],
                    )
                    break
        if rs is not None:
            found.append(rs)
    return found


def find_all_reduces(graph: torch.fx.Graph) -> list[AllReduce]:
    found = []
    for node in graph.nodes:
        if node.target is c10d.wait_tensor.default and (m := _ALL_REDUCE.match(node)):
            found.append(
                AllReduce(
                    nodes=_from_match(m), input=m.kwargs["input"], collective=node.args[0], wait=node,
                    reduce_op=m.kwargs["reduce_op"], group_name=m.kwargs["group_name"],
                )
            )
    return found


def forward_collective_copies(graph: torch.fx.Graph) -> int:
    """Replace ``copy(dst, wait_tensor(c))`` by ``wait_tensor(c)`` where ``dst`` has the same
    shape, dtype and strides; returns how many. Functionalized in-place c10d calls
    (``dist.all_reduce(t)``, ``dist.all_gather_into_tensor(out, x)``) take that form, and the extra
    use of ``dst`` would otherwise hide the matmul or the gathered value from the passes.
    """
    count = 0
    for node in list(graph.nodes):
        if node.target is not aten.copy.default or len(node.args) < 2:
            continue
        dst, src = node.args[0], node.args[1]
        if not (isinstance(src, torch.fx.Node) and src.target is c10d.wait_tensor.default):
            continue
        dv, sv = val(dst), val(src)
        if not (isinstance(dv, torch.Tensor) and isinstance(sv, torch.Tensor)):
            continue
        if (dv.shape, dv.dtype, dv.stride(), dv.device) != (sv.shape, sv.dtype, sv.stride(), sv.device):
            continue
        if dst.op == "placeholder":
            continue  # the mutation of a graph input is written back through this value
        node.replace_all_uses_with(src)
        graph.erase_node(node)
        if not dst.users and dst.target in (aten.empty.memory_format, aten.empty_strided.default):
            graph.erase_node(dst)
        count += 1
    return count


# ---------------------------------------------------------------------- chunk layout checks
def _piece_error(piece: Any, index: int, src: torch.fx.Node, dim: int, size: int, count: int) -> str | None:
    """Is ``piece`` the ``index``-th of ``count`` equal chunks of ``src`` along ``dim``?"""
    if not isinstance(piece, torch.fx.Node):
        return "a piece is not a graph value"
    if piece.target is operator.getitem:
        split, idx = piece.args
        if split.args[0] is not src or arg(split, 2, "dim", 0) != dim:
            return "pieces are not a split of one tensor along the collective's dim"
        sizes = split.args[1]
        sizes = list(sizes) if isinstance(sizes, (list, tuple)) else [sizes] * count
        if (len(sizes) < count or not all(known_eq(s, size) for s in sizes[:count])
                or not known_eq(val(src).shape[dim], size * count)):
            return f"split sizes {split.args[1]} are not {count} chunks of {size}"
        if idx != index:
            return f"piece {index} of the cat is chunk {idx}: chunks out of rank order"
        return None
    if piece.target is aten.slice.Tensor:
        d, start, end = arg(piece, 1, "dim", 0), arg(piece, 2, "start", 0), arg(piece, 3, "end", None)
        step = arg(piece, 4, "step", 1)
        if piece.args[0] is not src or d != dim or step != 1:
            return "pieces are not slices of one tensor along the collective's dim"
        if not (known_eq(start, index * size) and known_eq(end, (index + 1) * size)):
            return f"piece {index} is rows [{start}:{end}], not chunk {index} of size {size}"
        return None
    return f"piece {piece.name} is neither a split chunk nor a slice"


def gather_layout_error(ag: AllGather, ws: int) -> str | None:
    """Why the split/cat around a dim-0 gather does not re-assemble ``all_gather(shard, gather_dim)``."""
    cat = next((n for n in ag.nodes if n.target is aten.cat.default), None)
    if cat is None:  # the dim-0 form (possibly through no-op slices)
        return None
    pieces = cat.args[0]
    if len(pieces) != ws:
        return f"the gathered tensor is re-assembled from {len(pieces)} pieces, the group has {ws} ranks"
    wait = next(n for n in ag.nodes if n.target is c10d.wait_tensor.default)
    size = val(ag.shard).shape[0]
    for i, piece in enumerate(pieces):
        if err := _piece_error(piece, i, wait, 0, size, ws):
            return err
    return None


def scatter_layout_error(rs: ReduceScatter, ws: int) -> str | None:
    """Why the split/cat before a dim-0 reduce-scatter is not ``reduce_scatter(x, scatter_dim)``."""
    cat = rs.collective.args[0]
    if cat is rs.input:
        return None
    pieces = cat.args[0]
    if len(pieces) != ws:
        return f"the scattered tensor is assembled from {len(pieces)} pieces, the group has {ws} ranks"
    dim = rs.scatter_dim % val(rs.input).dim()
    if not decide(val(rs.input).shape[dim] % ws == 0):
        return f"scatter dim {dim} of {tuple(val(rs.input).shape)} is not divisible by {ws}"
    size = val(rs.input).shape[dim] // ws
    for i, piece in enumerate(pieces):
        if err := _piece_error(piece, i, rs.input, dim, size, ws):
            return err
    return None
