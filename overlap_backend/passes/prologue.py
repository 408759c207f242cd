"""Prologue hoist: the row-wise ops between an all-gather and its matmuls move onto the shard.

``all_gather(x) → rms_norm / layer_norm / cast → mm`` is what a model gives when it gathers the
sequence first and normalises the full tensor (or gathers float32 activations and casts them for a
bfloat16 GEMM). ``ag_mm`` could not match it: no matmul reads the gathered tensor, so the gather
was not overlapped at all. Every op in such a chain works on each row (every index of the gather
dim) on its own, so it commutes with the gather:

    mm(f(all_gather(x)))  ==  mm(all_gather(f(x)))

and the rewritten form is cheaper than fusing ``f`` into the GEMM's prologue: ``f`` runs once on
the shard (1/ws of the rows; a fused prologue would redo it for every column tile of the GEMM),
and a cast before the gather ships the narrower dtype (half the bytes for float32 → bfloat16).

``walk(ag)`` only looks. It collects the nodes downstream of the gathered value that are

- pointwise (``torch.Tag.pointwise``, which covers casts), or
- reductions over dims other than the gather dim with ``keepdim`` (``mean``, ``sum``, ``amax``,
  ``amin``, ``var``, ``var_mean`` and the ``getitem``s of its result: LayerNorm's statistics),

whose every tensor operand is either in the chain, or constant along the gather dim and computed
from constants alone. A graph input such as a norm weight is not: nothing in the graph says the
ranks hold the same one, and moved before the gather each rank would apply its own to its rows,
where the graph applies this rank's to all of them. A per-column weight (RMSNorm's ``x_hat * w``)
is folded into the matmuls' weights instead (``(x_hat * w) @ W == x_hat @ (w[:, None] * W)``,
``fold_scale``): this rank's ``w`` on every row, as the graph has it. After the scale the chain
may hold a per-column shift (LayerNorm's bias ``b``, folded into the matmuls' biases:
``(y + b) @ W == y @ W + b @ W``, ``fold_shift``) and casts (which move before them, onto the
shard: one rounding of ``x_hat`` instead of one of ``x_hat * w + b``, within the bf16 tolerance);
that value may feed only the matmuls (the op's gathered output would lack the folded ops).

The chain must leave through one value (its *end*, which the matmuls read); the gathered tensor
itself and every value inside must be read by nothing else (training graphs that save the gathered
input for the norm's backward keep their form, and say so). ``hoist``
(rewrite side) copies the chain onto the shard, makes the collective gather its end, and erases
the old chain: the graph is then the ``all_gather → (reshape) → mm`` form ``ag_mm`` rewrites.
"""

from __future__ import annotations

import heapq
import operator
from dataclasses import dataclass, field

import torch
import torch.fx


from ..spec import knobs
from .collectives import AllGather
from .fx import arg, aten, call, erase_dead, hoist_before, set_fake_value, val
from .matmuls import Matmul
from .sizes import hint, known_eq, prod

prims = torch.ops.prims
_REDUCTIONS = {  # target -> (index of its dims argument, index of keepdim or None where it is a kwarg only)
    aten.mean.dim: (1, 2), aten.sum.dim_IntList: (1, 2), aten.amax.default: (1, 2), aten.amin.default: (1, 2),
    aten.var.correction: (1, None), aten.var_mean.correction: (1, None),
}


@dataclass
class Prologue:
    """A chain of row-wise nodes between a gathered value and the matmuls that read its end."""

    nodes: list[torch.fx.Node] = field(default_factory=list)  # graph order (the folded scale and shift too)
    end: torch.fx.Node | None = None
    # ``mul(x, w)``, ``w`` a per-column [K] tensor that may differ between ranks (a norm weight):
    # not moved, folded into the matmuls' weights instead; after it only a shift and casts
    scale: torch.fx.Node | None = None
    scale_operand: torch.fx.Node | None = None
    # ``add(x, b)`` after the scale (LayerNorm's bias), ``b`` per column: folded into the matmuls' biases
    shift: torch.fx.Node | None = None
    shift_operand: torch.fx.Node | None = None
    # the end's readers that are not row-wise, and why (the matmuls among them)
    end_readers: list[tuple[torch.fx.Node, str]] = field(default_factory=list)
    gathered: torch.fx.Node | None = None  # the gathered value the chain starts from
    # ``sym_size`` nodes that read a chain value of the gathered shape (dynamic shapes): ``hoist``
    # points them at the gathered end, whose shape is the same
    shape_readers: list[torch.fx.Node] = field(default_factory=list)

    def report(self) -> dict:
        moved = [n.name for n in self.nodes if n not in self.folded]
        out = {"moved_before_gather": moved}
        if self.scale is not None:
            out["folded_into_weights"] = f"{self.scale.name} (* {self.scale_operand.name})"
        if self.shift is not None:
            out["folded_into_biases"] = f"{self.shift.name} (+ {self.shift_operand.name} @ weight)"
        return out

    @property
    def folded(self) -> dict[torch.fx.Node, torch.fx.Node]:
        """The folded ops (scale, shift), each with its per-column operand."""
        pairs = ((self.scale, self.scale_operand), (self.shift, self.shift_operand))
        return {n: w for n, w in pairs if n is not None}


def _tensors(v) -> list[torch.Tensor] | None:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (tuple, list)) and v and all(isinstance(t, torch.Tensor) for t in v):
        return list(v)
    return None


def _reduction_error(node: torch.fx.Node, gather_dim: int, ndim: int) -> str | None:
    index, keep_index = _REDUCTIONS[node.target]
    dims = arg(node, index, "dim", None)
    keepdim = arg(node, keep_index, "keepdim", False) if keep_index is not None else node.kwargs.get("keepdim", False)
    if dims is None:
        return f"{node.name} reduces every dim, the gather dim included"
    dims = [dims] if isinstance(dims, int) else list(dims)
    if any(not isinstance(d, int) for d in dims) or gather_dim in {d % ndim for d in dims}:
        return f"{node.name} reduces over the gather dim"
    if not keepdim:
        return f"{node.name} drops the reduced dims (keepdim=False)"
    return None


def _elementwise_or_reduction(node: torch.fx.Node) -> bool:
    t = node.target
    return isinstance(t, torch._ops.OpOverload) and (t in _REDUCTIONS or torch.Tag.pointwise in t.tags)


def _row_wise_error(node: torch.fx.Node, inside: set[torch.fx.Node], gathered: torch.Tensor,
                    gather_dim: int) -> str | None:
    """Why ``node`` (which reads a value of the chain) is not a row-wise step of it; None if it is."""
    what = f"{node.name} ({node.target})"
    if node.op != "call_function":
        return f"{node.name} is a graph output" if node.op == "output" else f"{what} is not an op"
    if node.target is operator.getitem:
        src = node.args[0]
        return None if src in inside and src.target is aten.var_mean.correction else f"{what} is not a row-wise op"
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or target._schema.is_mutable:
        return f"{what} is not a row-wise op"
    if torch.Tag.nondeterministic_seeded in target.tags:  # on the shard it would draw other numbers
        return f"{what} is random"
    if target in _REDUCTIONS:
        if (err := _reduction_error(node, gather_dim, gathered.dim())) is not None:
            return err
    elif torch.Tag.pointwise not in target.tags:
        return f"{what} is not a row-wise op"
    outs = _tensors(val(node))
    if outs is None:
        return f"no tensor metadata on {node.name}"
    for t in outs:
        if t.dim() != gathered.dim() or not known_eq(t.shape[gather_dim], gathered.shape[gather_dim]):
            return f"{what} changes the gathered rows: {tuple(t.shape)}"
    for inp in node.all_input_nodes:
        if inp in inside:
            continue
        v = val(inp)
        if not isinstance(v, torch.Tensor):
            return f"{what} reads {inp.name}, which is not a tensor"  # e.g. a size of the gathered value
        pos = gather_dim - (gathered.dim() - v.dim())  # the gather dim, right-aligned as broadcasting does
        if v.dim() > gathered.dim() or (pos >= 0 and not known_eq(v.shape[pos], 1)):
            return f"{what} reads {inp.name} {tuple(v.shape)}, which varies along the gather dim"
        if not _same_on_every_rank(inp):
            # After the move each rank would apply its own value to its own rows, where the graph
            # applies this rank's value to every gathered row: equal only if the ranks' values are.
            return (f"{what} reads {inp.name}, a tensor that may differ between ranks (a graph input: a norm "
                    f"weight, say); before the gather each rank would apply its own value to its rows")
    return None


def _column_affine(node: torch.fx.Node, inside: set[torch.fx.Node], gathered: torch.Tensor):
    """``("scale", w)`` where ``node`` is ``mul(x, w)``, ``("shift", w)`` where it is ``add(x, w)``
    (either order), ``x`` in the chain and ``w`` a contiguous tensor outside it with one value per
    column (``[K]``, or ``[1, .., K]``); else None."""
    if node.target is aten.mul.Tensor and len(node.args) == 2 and not node.kwargs:
        kind = "scale"
    elif node.target is aten.add.Tensor and len(node.args) == 2 and node.kwargs.get("alpha", 1) == 1:
        kind = "shift"
    else:
        return None
    a, b = node.args
    x, w = (a, b) if a in inside else (b, a)
    if x not in inside or w in inside or not isinstance(w, torch.fx.Node):
        return None
    v = val(w)
    k = gathered.shape[-1]
    if not isinstance(v, torch.Tensor) or v.dim() > gathered.dim() or v.dim() < 1 or not v.is_contiguous():
        return None
    if not known_eq(v.shape[-1], k) or not all(known_eq(d, 1) for d in v.shape[:-1]):
        return None
    return kind, w


def _affine_input(node: torch.fx.Node, operand: torch.fx.Node) -> torch.fx.Node:
    a, b = node.args
    return b if a is operand else a


def _reads_the_gathered_shape(node: torch.fx.Node, readers: list[torch.fx.Node], gathered: torch.Tensor) -> bool:
    """``sym_size(v, d)`` of a chain value ``v`` whose shape is the gathered value's."""
    if node.target is not aten.sym_size.int or len(readers) != 1:
        return False
    v = val(readers[0])
    return (isinstance(v, torch.Tensor) and v.dim() == gathered.dim()
            and all(known_eq(a, b) for a, b in zip(v.shape, gathered.shape)))


def _same_on_every_rank(node: torch.fx.Node) -> bool:
    """Is ``node``'s value computed from constants alone (no graph input, no collective, no random
    op), so that every rank of an SPMD program has the same?"""
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        t = n.target
        if n.op != "call_function" or not isinstance(t, torch._ops.OpOverload):
            return False
        if t.namespace in ("_c10d_functional", "c10d") or torch.Tag.nondeterministic_seeded in t.tags:
            return False
        stack.extend(n.all_input_nodes)
    return True


def walk(ag: AllGather) -> tuple[Prologue | None, str]:
    """The row-wise chain after ``ag``'s gathered value, or None and why there is none ("" where
    no row-wise op reads the gathered value at all)."""
    g = ag.result
    gv = val(g)
    if not isinstance(gv, torch.Tensor) or gv.dim() < 2:
        return None, "the gathered value has no rows to work on"
    gather_dim = ag.gather_dim % gv.dim()
    if gather_dim == gv.dim() - 1:
        return None, "gathered along its last dim: row-wise ops do not commute with that gather"
    if ag.collective.args[0] is not ag.shard:
        return None, f"the collective does not read the shard {ag.shard.name} itself"
    order = {n: i for i, n in enumerate(g.graph.nodes)}
    inside: set[torch.fx.Node] = {g}
    chain: list[torch.fx.Node] = []
    outside_users: dict[torch.fx.Node, list[tuple[torch.fx.Node, str]]] = {}  # chain value -> (reader, why not row-wise)
    heap = [(order[u], u) for u in g.users]
    heapq.heapify(heap)
    queued = set(g.users)
    affine: dict[str, tuple[torch.fx.Node, torch.fx.Node]] = {}  # "scale" / "shift" -> (node, operand)
    tail: set[torch.fx.Node] = set()  # the affine ops and what follows them
    shape_readers: list[torch.fx.Node] = []  # sym_size of a chain value of the gathered shape (dynamic shapes)
    while heap:
        _, node = heapq.heappop(heap)  # graph order: a node's chain inputs are decided before it
        readers = [i for i in node.all_input_nodes if i in inside]
        if _reads_the_gathered_shape(node, readers, gv):
            shape_readers.append(node)  # a size, not the value: the gathered end has the same
            continue
        col = _column_affine(node, inside, gv)
        if tail & set(readers):
            err = None
            if node.target is not prims.convert_element_type.default and not (
                    col is not None and col[0] == "shift" and "shift" not in affine and len(readers) == 1):
                after = " and ".join(n.name for n, _ in affine.values())
                err = f"{node.name} ({node.target}) follows the per-column {after}: only casts may (and a shift after a scale)"
        else:
            err = _row_wise_error(node, inside, gv, gather_dim)
            if err is not None and col is not None and col[0] not in affine and not tail:
                err = None
            else:
                col = None
        if err is not None:
            for r in readers:
                outside_users.setdefault(r, []).append((node, err))
            continue
        if col is not None:
            affine[col[0]] = (node, col[1])
        if col is not None or tail & set(readers):
            tail.add(node)
        if len(chain) == knobs.passes.PROLOGUE_MAX_NODES:
            return None, f"more than {knobs.passes.PROLOGUE_MAX_NODES} row-wise ops after the gather"
        inside.add(node)
        chain.append(node)
        for u in node.users:
            if u not in queued:
                queued.add(u)
                heapq.heappush(heap, (order[u], u))
    if not chain:  # say why only where a reader of the gathered value looked like a prologue
        near = [why for u, why in outside_users.get(g, []) if _elementwise_or_reduction(u)]
        return None, near[0] if near else ""
    if g in outside_users:
        readers = outside_users[g]
        u, why = readers[0]
        why = "a graph output (a training graph saves it for backward)" if u.op == "output" else why
        return None, f"the gathered value {g.name} is also read by {', '.join(r.name for r, _ in readers)}: {why}"
    exits = [n for n in chain if n in outside_users]
    if len(exits) != 1:
        listed = "; ".join(f"{n.name} is read by {u.name}: {why}" for n in exits for u, why in outside_users[n][:1])
        return None, f"{len(exits)} values leave the row-wise ops after the gather ({listed})"
    end = exits[0]
    if tail and end not in tail:
        return None, f"the per-column {' and '.join(n.name for n, _ in affine.values())} do not lead to the chain's end {end.name}"
    folded = dict(affine.values())
    first = end
    while first in folded:  # what the hoisted chain ends with once the affine ops are left out
        first = _affine_input(first, folded[first])
    if val(first).dtype != val(end).dtype:
        return None, f"{end.name} promotes the chain's dtype: folded into the weights it would not"
    scale, shift = affine.get("scale", (None, None)), affine.get("shift", (None, None))
    return Prologue(chain, end, *scale, *shift, outside_users[end], g, shape_readers), ""


def hoist(ag: AllGather, prologue: Prologue) -> torch.fx.Node:
    """Copy ``prologue`` onto ``ag``'s shard, gather its end instead, erase the old chain. A
    per-column scale and shift are left out (the caller folds them: ``fold_scale``, ``fold_shift``).
    Returns the new shard (the copy of the end). The gather's nodes get fresh fake values (a cast
    changes their dtype)."""
    graph = ag.result.graph
    inside = set(prologue.nodes)
    outer = [i for n in prologue.nodes for i in n.all_input_nodes if i not in inside and i is not ag.result]
    hoist_before(ag.collective, list(dict.fromkeys(outer)))
    copies: dict[torch.fx.Node, torch.fx.Node] = {ag.result: ag.shard}
    folded = prologue.folded
    with graph.inserting_before(ag.collective):
        for n in prologue.nodes:
            if n in folded:  # what follows reads its chain input
                copies[n] = copies[_affine_input(n, folded[n])]
                continue
            args = torch.fx.node.map_arg(n.args, lambda a: copies.get(a, a))
            kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: copies.get(a, a))
            copies[n] = call(graph, n.target, args, kwargs)
    shard = copies[prologue.end]
    ag.collective.replace_input_with(ag.shard, shard)
    order = {n: i for i, n in enumerate(graph.nodes)}
    for n in sorted(ag.nodes, key=order.__getitem__):
        n.meta.pop("tensor_meta", None)
        set_fake_value(n)
    for n in prologue.shape_readers:
        n.replace_input_with(n.args[0], ag.result)
    prologue.end.replace_all_uses_with(ag.result)
    erase_dead(list(reversed(prologue.nodes)))
    return shard


def fold(anchor: torch.fx.Node, weights: list[torch.fx.Node], biases: list[torch.fx.Node | None],
         prologue: Prologue) -> tuple[list[torch.fx.Node], list[torch.fx.Node | None]]:
    """The matmuls' weights and biases with ``prologue``'s scale and shift folded in, computed just
    before ``anchor`` (the op's place); unchanged where it folds nothing."""
    if not prologue.folded:
        return weights, biases
    graph = anchor.graph
    hoist_before(anchor, [*prologue.folded.values(), *weights, *[b for b in biases if b is not None]])
    with graph.inserting_before(anchor):
        if prologue.shift is not None:  # b @ W with the weights as they were
            biases = [fold_shift(graph, w, b, prologue) for w, b in zip(weights, biases)]
        if prologue.scale is not None:
            weights = [fold_scale(graph, w, prologue) for w in weights]
    return weights, biases


def fold_scale(graph: torch.fx.Graph, weight: torch.fx.Node, prologue: Prologue) -> torch.fx.Node:
    """``weight * w[:, None]`` (inserted at the graph's insertion point), the ``[K, N]`` weight of a
    matmul that read ``x * w``: ``(x * w) @ W == x @ (w[:, None] * W)``, with this rank's ``w`` on
    every row as the graph has it. Computed in float32, rounded once to the weight's dtype."""
    w = prologue.scale_operand
    dtype = val(weight).dtype
    # -1, not the size: a symbolic size cannot be written into the graph as a constant
    column = _as_dtype(graph, call(graph, aten.view.default, (w, [-1, 1])), torch.float32)
    scaled = call(graph, aten.mul.Tensor, (_as_dtype(graph, weight, torch.float32), column))
    return _as_dtype(graph, scaled, dtype)


def _as_dtype(graph: torch.fx.Graph, node: torch.fx.Node, dtype: torch.dtype) -> torch.fx.Node:
    if val(node).dtype == dtype:
        return node
    return call(graph, prims.convert_element_type.default, (node, dtype))


def fold_shift(graph: torch.fx.Graph, weight: torch.fx.Node, bias: torch.fx.Node | None,
               prologue: Prologue) -> torch.fx.Node:
    """The ``[N]`` bias of a matmul that read ``y + b`` (``weight``: its ``[K, N]`` weight before any
    fold): ``(y + b) @ W == y @ W + b @ W``, plus its own bias. ``b @ W`` is a GEMM in the weight's
    dtype (float32 accumulation; a float32 copy of ``W`` would cost more than the product: 0.05 to
    0.09 ms at the TP block's QKV shape, bench/probe_prologue.py)."""
    b = prologue.shift_operand
    dtype = val(weight).dtype
    row = _as_dtype(graph, call(graph, aten.view.default, (b, [1, -1])), dtype)  # -1: see fold_scale
    shift = call(graph, aten.view.default, (call(graph, aten.mm.default, (row, weight)), [-1]))
    if bias is not None:
        total = call(graph, aten.add.Tensor, (_as_dtype(graph, shift, torch.float32),
                                              _as_dtype(graph, bias, torch.float32)))
        shift = _as_dtype(graph, total, dtype)
    return shift


def cost_terms(prologue: Prologue, matmuls: list[Matmul]) -> dict[str, int]:
    """``cost.Problem``'s prologue fields: the bytes the chain moves over the gathered rows in
    the plain graph (its input read, its end written: a fused norm), and what the folds add per call
    (the scale: each weight read and written; the shift: each weight read once more)."""
    g, end = val(prologue.gathered), val(prologue.end)
    rows = prod(hint(d) for d in g.shape[:-1])
    k = hint(g.shape[-1])
    moved = rows * k * (g.element_size() + end.element_size())
    weights = [prod(hint(d) for d in val(mm.b).shape) * val(mm.b).element_size() for mm in matmuls]
    fold_bytes = (2 * sum(weights) if prologue.scale is not None else 0) + (
        sum(weights) if prologue.shift is not None else 0)
    folds = len(matmuls) * len(prologue.folded)
    return {"prologue_bytes": moved, "fold_bytes": fold_bytes, "folds": folds}
