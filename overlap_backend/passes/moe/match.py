"""Matching the expert block (only looks at the graph): ``find_moe`` starts from every all-to-all whose
input comes from GEMMs, walks the row moves back to the experts (forward: ``match_experts``; backward:
their input gradients, ``match_backward``) and on to the dispatch all-to-all, and records where the
structure differs from the block (``MoeMatch.failure``)."""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx
from torch._inductor.pattern_matcher import MULTIPLE, CallFunction, KeywordArg

from ..fx import RESHAPES, SPLITS, arg, val
from .match_backward import is_expert_grads, match_expert_grads
from .structure import (CASTS, AllToAll, Experts, MoeMatch, NoMatch, Step, describe_node, gemm_operands, is_gemm,
                        is_grouped, look_through, shape_of, size_eq)

aten = torch.ops.aten
c10d = torch.ops._c10d_functional

# wait_tensor(all_to_all_single(input, output_split_sizes, input_split_sizes, group_name)); the
# collective may also be read by sym_size (the received row count, saved for backward).
_A2A = CallFunction(
    c10d.wait_tensor.default,
    CallFunction(
        c10d.all_to_all_single.default,
        KeywordArg("input"), KeywordArg("output_splits"), KeywordArg("input_splits"), KeywordArg("group_name"),
        _users=MULTIPLE,
    ),
)


def _silu_patterns():
    g = KeywordArg("g")
    return [
        CallFunction(aten.silu.default, g),
        # x / (1 + exp(-x)): Inductor's decomposition
        CallFunction(
            aten.div.Tensor, g,
            CallFunction(aten.add.Tensor, CallFunction(aten.exp.default, CallFunction(aten.neg.default, g, _users=MULTIPLE), _users=MULTIPLE), 1, _users=MULTIPLE),
        ),
        CallFunction(aten.mul.Tensor, g, CallFunction(aten.sigmoid.default, g, _users=MULTIPLE)),
        CallFunction(aten.mul.Tensor, CallFunction(aten.sigmoid.default, g, _users=MULTIPLE), g),
    ]


_SILU = _silu_patterns()


# ------------------------------------------------------------------------------ matching
def find_all_to_alls(graph: torch.fx.Graph) -> list[AllToAll]:
    found = []
    for node in graph.nodes:
        if node.target is c10d.wait_tensor.default and (m := _A2A.match(node)):
            found.append(
                AllToAll(
                    collective=node.args[0], wait=node, input=m.kwargs["input"],
                    output_splits=list(m.kwargs["output_splits"]), input_splits=list(m.kwargs["input_splits"]),
                    group_name=m.kwargs["group_name"],
                )
            )
    return found


def _is_a2a_wait(node: Any) -> bool:
    return (
        isinstance(node, torch.fx.Node)
        and node.target is c10d.wait_tensor.default
        and isinstance(node.args[0], torch.fx.Node)
        and node.args[0].target is c10d.all_to_all_single.default
    )


def _row_step(node: torch.fx.Node, scatter_accumulate_ok: bool = False) -> Step | None:
    """``node`` as a row move, or None."""
    t = node.target
    if t in RESHAPES:
        return Step(node, "view", node.args[0])
    if t is aten.permute.default:
        return Step(node, "permute", node.args[0])
    if t is aten.clone.default:
        return Step(node, "clone", node.args[0])
    if t in CASTS:
        return Step(node, "cast", node.args[0])
    if t is aten.index.Tensor:
        return Step(node, "gather", node.args[0], index=list(node.args[1]))
    if t is aten.index_put.default:
        accumulate = arg(node, 3, "accumulate", False)
        if accumulate and not scatter_accumulate_ok:
            return None
        return Step(node, "scatter", node.args[2], index=list(node.args[1]), base=node.args[0])
    return None


# How backward graphs assemble per-expert gradients (and the loop form its outputs).
_GRADIENT_JOINS = (
    aten.add.Tensor, aten.cat.default, aten.stack.default, aten.select_scatter.default, aten.slice_scatter.default,
)


def _opaque_grouped_backward(n: Any) -> bool:
    """``n = getitem(transformers::grouped_mm_fallback_backward(...), i)``: one op that computes a
    grouped GEMM's input and weight gradients together (the pass reports it, it cannot split it)."""
    src = n.args[0] if isinstance(n, torch.fx.Node) and n.target is operator.getitem else None
    return (isinstance(src, torch.fx.Node) and isinstance(src.target, torch._ops.OpOverload)
            and src.target._schema.name == "transformers::grouped_mm_fallback_backward")


def _reaches_gemm(node: torch.fx.Node) -> bool:
    """Is ``node`` computed from a GEMM through row moves (or sums/concatenations of them)?

    Decides which all-to-alls are reported as candidates: the combine of an expert block, forward
    or backward; not, e.g., the next layer's dispatch.
    """
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if not isinstance(n, torch.fx.Node) or n in seen:
            continue
        seen.add(n)
        if is_gemm(look_through(n)) or n.target is aten.addmm.default or _opaque_grouped_backward(n):
            # (addmm: Inductor's fold of mm + mm)
            return True
        if (step := _row_step(n, scatter_accumulate_ok=True)) is not None:
            stack.append(step.src)
        elif n.target in _GRADIENT_JOINS:
            stack.extend(n.all_input_nodes)
    return False


def _walk_out(y: torch.fx.Node, accumulate_ok: bool = False) -> tuple[list[Step], torch.fx.Node]:
    """The row moves from the experts' output to the combine input ``y`` (in that order).

    ``accumulate_ok``: scatters with ``accumulate=True`` are row moves too (a backward graph's
    gradient of a gather: it adds the gradients of a row read twice, as ``moe_experts_backward``
    does); the walk then also stops at an ``add`` (a backward's ``dX = dG @ Wg^T + dU @ Wu^T``)."""
    steps, n = [], y
    while True:
        if is_gemm(look_through(n)) or n.target in (aten.cat.default, aten.stack.default):
            return list(reversed(steps)), n
        if accumulate_ok and n.target is aten.add.Tensor:
            return list(reversed(steps)), n
        if _opaque_grouped_backward(n):
            raise NoMatch(f"the experts' input gradient {n.name} comes from transformers::grouped_mm_fallback_backward, "
                          "one op computing the input and the weight gradients of a float32 grouped GEMM (a bfloat16 "
                          "model's backward holds aten._grouped_mm GEMMs, which are rewritten)")
        if n.target is aten.index_put.default and arg(n, 3, "accumulate", False) and not accumulate_ok:
            raise NoMatch(f"the combined rows are scattered with accumulate=True ({n.name})")
        step = _row_step(n, scatter_accumulate_ok=accumulate_ok)
        if step is None:
            raise NoMatch(f"the combined tensor is computed by {describe_node(n)}, not moved rows of expert GEMMs")
        steps.append(step)
        n = step.src


def _walk_in(x: torch.fx.Node, accumulate_ok: bool = False) -> tuple[list[Step], torch.fx.Node]:
    """The row moves from a received all-to-all output to the grouped rows ``x`` (in that order).

    ``accumulate_ok`` (backward graphs): a scatter with ``accumulate=True`` into zeros is a row move,
    the gradient of the forward's gather by the same index: its rows are distinct, as the forward's
    scatter into the padded layout by that index assumed (duplicates made the forward undefined)."""
    steps, n = [], x
    while not _is_a2a_wait(n):
        step = _row_step(n, scatter_accumulate_ok=accumulate_ok)
        if step is None:
            raise NoMatch(f"the experts' input is computed by {describe_node(n)}, not moved rows of an all_to_all_single")
        steps.append(step)
        n = step.src
    return list(reversed(steps)), n


def _strip_cast(n: Any) -> tuple[Any, list[torch.fx.Node]]:
    if isinstance(n, torch.fx.Node) and n.target in CASTS:
        return n.args[0], [n]
    return n, []


def _silu_of(n: torch.fx.Node) -> tuple[torch.fx.Node, list[torch.fx.Node]] | None:
    """``n = silu(g)`` (optionally upcast inside and cast back outside): ``(g, nodes)``."""
    inner, outer = _strip_cast(n)
    if not isinstance(inner, torch.fx.Node):
        return None
    for pattern in _SILU:
        if m := pattern.match(inner):
            g, upcast = _strip_cast(m.kwargs["g"])
            nodes = outer + [x for x in m.nodes if isinstance(x, torch.fx.Node)] + upcast
            return g, nodes
    return None


def last_dim(n: torch.fx.Node, dim: Any) -> bool:
    """Is ``dim`` the last dimension of ``n``'s value?"""
    rank = len(shape_of(n))
    return isinstance(dim, int) and dim % rank == rank - 1


def half_of(n: Any) -> tuple[torch.fx.Node, int, list[torch.fx.Node]] | None:
    """``n`` as one half of a tensor's last dim: ``(y, 0 or 1, nodes)`` for ``y.chunk(2, -1)[i]``,
    ``y.split(F, -1)[i]``, ``y.split([F, F], -1)[i]``, ``y[..., :F]`` or ``y[..., F:]`` (``y``: 2F wide)."""
    if not isinstance(n, torch.fx.Node):
        return None
    if n.target is operator.getitem and isinstance(n.args[0], torch.fx.Node) and n.args[0].target in SPLITS:
        split, i = n.args[0], n.args[1]
        y, sizes, dim = split.args[0], split.args[1], arg(split, 2, "dim", 0)
        if not (isinstance(y, torch.fx.Node) and last_dim(y, dim) and i in (0, 1)):
            return None
        width = shape_of(y)[-1]
        if isinstance(sizes, (list, tuple)):
            ok = len(sizes) == 2 and size_eq(sizes[0], sizes[1]) and size_eq(width, sizes[0] + sizes[1])
        else:
            ok = size_eq(width, 2 * sizes)
        return (y, i, [n, split]) if ok else None
    if n.target is aten.slice.Tensor and isinstance(n.args[0], torch.fx.Node):
        y = n.args[0]
        dim, start, end, step = arg(n, 1, "dim", 0), arg(n, 2, "start", 0), arg(n, 3, "end"), arg(n, 4, "step", 1)
        width = shape_of(y)[-1]
        if not (last_dim(y, dim) and step == 1 and isinstance(width, int) and width % 2 == 0):
            return None
        f = width // 2
        start = 0 if start is None else start
        end = width if end is None or (isinstance(end, int) and end >= width) else end
        if (start, end) == (0, f):
            return y, 0, [n]
        if (start, end) in ((f, width), (f - width, width)):
            return y, 1, [n]
    return None


def _gate_and_up(gate: torch.fx.Node, up: torch.fx.Node, kind) -> dict:
    """The gate and up projections: two GEMMs of one input, or the two halves of one GEMM on a fused
    ``[., H, 2F]`` weight (either half first)."""
    views: list[torch.fx.Node] = []  # no-op views around the GEMMs (x @ w)
    hg, hu = half_of(gate), half_of(up)
    if hg is not None and hu is not None:
        (y, ig, nodes_g), (y_u, iu, nodes_u) = hg, hu
        if y_u is not y or ig == iu:
            raise NoMatch(f"gate {gate.name} and up {up.name} are not the two halves of one fused GEMM")
        x, w, offs = gemm_operands(y, kind, views)
        return dict(x=x, w_gate=w, w_up=w, offs=offs, fused=[look_through(y)], gate_first=ig == 0,
                    pieces=list(dict.fromkeys(nodes_g + nodes_u + views)))
    x, w_gate, offs_g = gemm_operands(gate, kind, views)
    x_u, w_up, offs_u = gemm_operands(up, kind, views)
    if x_u is not x:
        raise NoMatch(f"gate {gate.name} and up {up.name} projections read different inputs")
    if offs_g is not offs_u:
        raise NoMatch("the gate and up grouped GEMMs do not share one offs tensor")
    gemms = [g for g in (look_through(gate), look_through(up)) if g not in (gate, up)]
    return dict(x=x, w_gate=w_gate, w_up=w_up, offs=offs_g, fused=[], gate_first=True,
                pieces=list(dict.fromkeys(views + gemms)))


def _swiglu(down: torch.fx.Node, kind):
    """``down = kind(silu(gate) * up, w_down)`` with gate/up ``kind(x, w)`` of one ``x``, or the halves
    of one ``kind(x, w_gate_up)``."""
    views: list[torch.fx.Node] = []
    act, w_down, offs = gemm_operands(down, kind, views)
    if not (isinstance(act, torch.fx.Node) and act.target is aten.mul.Tensor):
        raise NoMatch(f"the down projection {down.name} does not read silu(gate) * up but {describe_node(act)}")
    for s, u in ((act.args[0], act.args[1]), (act.args[1], act.args[0])):
        if isinstance(s, torch.fx.Node) and (silu := _silu_of(s)) is not None:
            gate, silu_nodes = silu
            break
    else:
        raise NoMatch(f"{act.name} is not silu(gate) * up")
    if not isinstance(u, torch.fx.Node):
        raise NoMatch(f"{act.name} multiplies silu(gate) by {u!r}, not the up projection")
    gu = _gate_and_up(gate, u, kind)
    if is_grouped(kind) and not (offs is gu["offs"] and isinstance(offs, torch.fx.Node)):
        raise NoMatch("the grouped GEMMs do not share one offs tensor")
    return dict(x=gu["x"], gate=gate, up=u, act=act, w_gate=gu["w_gate"], w_up=gu["w_up"], w_down=w_down, offs=offs,
                inner=silu_nodes + gu["pieces"] + views, fused=gu["fused"], gate_first=gu["gate_first"],
                down=look_through(down))


def _piece(x: torch.fx.Node) -> tuple[torch.fx.Node, Any, list[torch.fx.Node], Any]:
    """A loop expert's input rows: ``(base, index, nodes, split)`` for ``select(base, 0, i)`` or
    ``getitem(split(base, sizes), i)`` (after an optional cast)."""
    n, casts = _strip_cast(x)
    if isinstance(n, torch.fx.Node) and n.target is aten.select.int and arg(n, 1, "dim") == 0:
        return n.args[0], arg(n, 2, "index"), casts + [n], None
    if isinstance(n, torch.fx.Node) and n.target is operator.getitem:
        split = n.args[0]
        if isinstance(split, torch.fx.Node) and split.target in SPLITS and arg(split, 2, "dim", 0) == 0:
            return split.args[0], n.args[1], casts + [n], split
    raise NoMatch(f"a loop expert's input {describe_node(x)} is not a select or split piece of one tensor")


def _match_experts(d: torch.fx.Node) -> Experts:
    gemm = look_through(d)  # (d: the GEMM, or shape ops around it that compose to the identity)
    if gemm.target is aten.bmm.default or is_grouped(gemm.target):
        form = "bmm" if gemm.target is aten.bmm.default else "grouped_mm"
        s = _swiglu(d, gemm.target)
        sizes = None
        if form == "bmm":
            shape = val(s["x"]).shape
            sizes = [shape[1]] * shape[0]
        return Experts(
            form=form, grouped=s["x"], gate=[s["gate"]], up=[s["up"]], act=[s["act"]], down=[s["down"]],
            w_gate=[s["w_gate"]], w_up=[s["w_up"]], w_down=[s["w_down"]], down_out=d,
            offsets=s["offs"], group_sizes=sizes, inner=s["inner"], fused=s["fused"], gate_first=s["gate_first"],
        )
    if gemm.target is aten.mm.default:
        raise NoMatch(f"a single mm ({d.name}) produces the combined rows, not a group of experts")
    # loop: cat/stack of one SwiGLU of mm per expert
    if arg(d, 1, "dim", 0) != 0:
        raise NoMatch(f"the experts' outputs are concatenated along dim {arg(d, 1, 'dim', 0)}, not 0")
    outs = list(d.args[0])
    per = [_swiglu(o, aten.mm.default) for o in outs]
    if len({bool(p["fused"]) for p in per}) != 1 or len({p["gate_first"] for p in per}) != 1:
        raise NoMatch("the loop's experts do not all compute gate and up the same way (fused, half order)")
    pieces = [_piece(p["x"]) for p in per]
    base, split = pieces[0][0], pieces[0][3]
    for i, (b, idx, _, sp) in enumerate(pieces):
        if b is not base or sp is not split:
            raise NoMatch("the loop's experts read pieces of different tensors")
        if idx != i:
            raise NoMatch(f"the loop's expert {i} reads piece {idx}: pieces out of order")
    bshape = val(base).shape
    if split is None:
        if len(bshape) != 3 or not size_eq(bshape[0], len(per)):
            raise NoMatch(f"the loop selects {len(per)} experts from a tensor of shape {tuple(bshape)}")
        sizes = [bshape[1]] * len(per)
    elif split.target is aten.split.Tensor:
        size = split.args[1]
        if not isinstance(size, int) or not size_eq(bshape[0], size * len(per)):
            raise NoMatch(f"the loop splits {tuple(bshape)} into chunks of {size}, not {len(per)} equal pieces")
        sizes = [size] * len(per)
    else:
        sizes = list(split.args[1])
        if len(sizes) != len(per):
            raise NoMatch(f"the loop runs {len(per)} experts on {len(sizes)} pieces")
    if d.target is aten.stack.default and split is not None:
        raise NoMatch("the loop stacks experts of different row counts")
    inner = [n for p, pc in zip(per, pieces) for n in p["inner"] + pc[2]] + ([split] if split is not None else [])
    return Experts(
        form="loop", grouped=base, gate=[p["gate"] for p in per], up=[p["up"] for p in per],
        act=[p["act"] for p in per], down=[p["down"] for p in per], w_gate=[p["w_gate"] for p in per],
        w_up=[p["w_up"] for p in per], w_down=[p["w_down"] for p in per], down_out=d,
        group_sizes=sizes, inner=inner, pieces=[p["x"] for p in per], split=split,
        fused=[n for p in per for n in p["fused"]], gate_first=per[0]["gate_first"],
    )


def find_moe(graph: torch.fx.Graph) -> list[MoeMatch]:
    """Every all-to-all whose input comes from GEMMs, with the MoE block around it (or why not)."""
    a2as = find_all_to_alls(graph)
    by_wait = {a.wait: a for a in a2as}
    matches = []
    for combine in a2as:
        if not _reaches_gemm(combine.input):
            continue
        m = MoeMatch(combine)
        try:
            m.out_steps, out = _walk_out(combine.input, accumulate_ok=True)
            if is_expert_grads(out):  # a backward graph: the experts' input gradients
                try:
                    m.grads = match_expert_grads(out)
                except NoMatch as e:  # (a forward graph's add, e.g. a shared expert's output, lands here too)
                    raise NoMatch(f"the combined tensor is computed by {describe_node(out)}: neither moved rows "
                                  f"of expert GEMMs nor the experts' input gradients ({e})") from None
                grouped = m.grads.dy
            else:
                for st in m.out_steps:
                    if st.kind == "scatter" and arg(st.node, 3, "accumulate", False):
                        raise NoMatch(f"the combined rows are scattered with accumulate=True ({st.node.name}) "
                                      f"from {describe_node(out)}: gradients, but not the experts' "
                                      "dX = dG @ Wg^T + dU @ Wu^T")
                m.experts = _match_experts(out)
                grouped = m.experts.grouped
            m.in_steps, recv = _walk_in(grouped, accumulate_ok=m.grads is not None)
            m.dispatch = by_wait[recv]
        except NoMatch as e:
            m.failure = str(e)
        matches.append(m)
    return matches
