"""Matching helpers shared by the passes: collectives, matmuls, preconditions, node surgery.

Everything named ``find_*`` / ``match_*`` only looks at the graph. The collective patterns are
written with Inductor's own matcher (``torch._inductor.pattern_matcher``); the slice/cat forms
that AOTAutograd's backward produces are matched by hand (a variable-length list of slices of one
node is not expressible with ``ListOf`` alone).
"""

from __future__ import annotations

import contextvars
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch._inductor.pattern_matcher import MULTIPLE, CallFunction, Ignored, KeywordArg, ListOf, Match

from .manager import Rejected
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols, guard_or_false, statically_known_true

aten = torch.ops.aten
c10d = torch.ops._c10d_functional

RESHAPES = (aten.reshape.default, aten.view.default, aten._unsafe_view.default)
SPLITS = (aten.split.Tensor, aten.split.sizes, aten.split_with_sizes.default)
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
REDUCE_OPS = ("sum", "avg", "product", "min", "max")


def val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def arg(node: torch.fx.Node, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


# ------------------------------------------------------------------------------- collectives
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
    order = {n: i for i, n in enumerate(graph.nodes)}
    return sorted(found.values(), key=lambda ag: order[ag.collective])


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


# ----------------------------------------------------------------------------------- matmuls
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


# ------------------------------------------------------------------------------ symbolic sizes
# Sizes may be SymInts (``dynamic=True``, ``mark_dynamic``). Facts about them are decided in two ways:
# ``known_*`` holds for every value of the symbols (no guard: e.g. the gathered dim is ``ws * s0``
# by construction); ``decide`` installs a ShapeEnv guard when the fact is not known either way, so
# that an input for which it would change recompiles. Neither ever depends on the rank.
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


def is_symbolic(x: Any) -> bool:
    return isinstance(x, torch.SymInt) and not x.node.expr.is_number


def _sym_node(graph: torch.fx.Graph, value: Any, before: torch.fx.Node, create: bool) -> Any:
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
        node = _sym_node(graph, sub, before, create)
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
        if _sym_node(graph, s, before, create=False) is None:
            raise Rejected(f"symbolic size {s} cannot be computed from the graph's values")


def size_args(graph: torch.fx.Graph, sizes, before: torch.fx.Node) -> list[Any]:
    """``sizes`` as node arguments: ints stay, SymInts become nodes that compute them (created
    before ``before`` where the graph has none)."""
    out = []
    for s in sizes:
        node = _sym_node(graph, s, before, create=True)
        if node is None:
            raise AssertionError(f"symbolic size {s} cannot be computed from the graph's values")
        out.append(node)
    return out


# ----------------------------------------------------------------------------- preconditions
def ancestors(node: torch.fx.Node) -> set[torch.fx.Node]:
    seen: set[torch.fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        for inp in n.all_input_nodes:
            if inp not in seen:
                seen.add(inp)
                stack.append(inp)
    return seen


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


def choose_lowering(ctx, group_name: str, device_type: str) -> str:
    """The lowering for a match on ``device_type`` tensors, identical on every rank of the group.

    ``auto`` takes ``symm`` when every rank of the group is a CUDA process on this node with peer
    access (``runtime.symm.group_support`` agrees on that with one collective per group, cached),
    else ``p2p``. An explicit choice is kept; ``symm`` falls back to ``p2p`` at run time, on every
    rank at once, where its setup fails. :class:`Rejected` where the op would end on ``p2p`` with
    CUDA tensors over a group that cannot send them point to point (gloo): the collective, which
    gloo does run on CUDA tensors, is left as it is.
    """
    from torch.distributed.distributed_c10d import _resolve_process_group

    from ..runtime import p2p, symm

    lowering = ctx.config.lowering
    if lowering == "auto":
        lowering = "symm" if symm.group_support(group_name) is None else "p2p"
    if device_type == "cuda" and not p2p.sends_cuda_tensors(_resolve_process_group(group_name)) and (
            lowering != "symm" or symm.group_support(group_name) is not None):
        raise Rejected(f"group {group_name!r} is a gloo group and gloo cannot send CUDA tensors point to point "
                       f"(the {lowering} lowering's path here): the collective is left as it is")
    return lowering


def lowering_candidates(ctx, lowering: str, symm_runs: bool = True) -> list[str]:
    """The lowerings the cost model may pick from, ``lowering`` (the pass's own choice) first: with
    ``OVERLAP_LOWERING=auto`` a symm-capable group may also run ``p2p``; an explicit lowering is
    kept. ``symm_runs=False``: the op's symm kernels would not run here (the runtime falls back to
    p2p), so the model prices p2p."""
    first = lowering if (lowering != "symm" or symm_runs) else "p2p"
    if ctx.config.lowering == "auto" and first == "symm":
        return ["symm", "p2p"]
    return [first]


def written_lowering(ctx, lowering: str, decision) -> str:
    """The lowering to write: an explicit ``OVERLAP_LOWERING`` as given, else the model's pick."""
    return lowering if ctx.config.lowering != "auto" else decision.lowering


def hint(size: Any, fallback: int = 4096) -> int:
    """An int for the cost model: ``size`` itself, or the hint of a symbolic size (the example
    input's value, the same on every rank of an SPMD program). Never guards: the model's choice is
    a heuristic, not a precondition. Unbacked sizes have no hint: ``fallback``."""
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


def dtype_name(node: torch.fx.Node) -> str:
    return str(val(node).dtype).removeprefix("torch.")


def device_type(node: torch.fx.Node) -> str:
    v = val(node)
    return v.device.type if isinstance(v, torch.Tensor) else "cpu"


# ---------------------------------------------------------------------------- node surgery
def set_fake_value(node: torch.fx.Node) -> None:
    """Fill ``node.meta['val']`` by running its target on the inputs' fake values."""
    from torch._guards import detect_fake_mode

    vals = [val(n) for n in node.all_input_nodes]
    fake_mode = detect_fake_mode(vals)
    if fake_mode is None or any(v is None for v in vals):
        return

    def to_val(a):
        return val(a) if isinstance(a, torch.fx.Node) else a

    args = torch.fx.node.map_aggregate(node.args, to_val)
    kwargs = torch.fx.node.map_aggregate(node.kwargs, to_val)
    with fake_mode:
        node.meta["val"] = node.target(*args, **kwargs)


def call(graph: torch.fx.Graph, target, args, kwargs=None) -> torch.fx.Node:
    node = graph.call_function(target, tuple(args), kwargs or {})
    set_fake_value(node)
    return node


def erase_dead(nodes: list[torch.fx.Node]) -> None:
    """Erase the nodes of a replaced match that nothing uses any more (users before inputs)."""
    changed = True
    pending = [n for n in nodes if n.graph is not None]
    while changed:
        changed = False
        for n in list(pending):
            if len(n.users) == 0:
                n.graph.erase_node(n)
                pending.remove(n)
                changed = True


def hoist_before(anchor: torch.fx.Node, roots: list[torch.fx.Node]) -> None:
    """Move the ancestors of ``roots`` that come after ``anchor`` to just before it, in order.

    Only valid when none of them depends on a node at or after ``anchor`` that is not moved; the
    passes check that the weights do not depend on the collective before calling this.
    """
    graph = anchor.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    late = {n for r in roots for n in (ancestors(r) | {r}) if order[n] > order[anchor] and n.op != "placeholder"}
    for n in sorted(late, key=order.__getitem__):
        anchor.prepend(n)


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
    if ag.result.target is c10d.wait_tensor.default:
        return None
    pieces = ag.result.args[0]
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
