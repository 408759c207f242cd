"""Matching a backward graph's expert block: between its two all-to-alls, the experts' input gradients
(``ExpertGrads``) in the bmm, grouped_mm and loop forms; the pointwise SwiGLU derivative is recognised
by evaluating it, whatever decomposed form the graph holds. Only looks at the graph."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..fx import arg, val
from .structure import (ExpertGrads, NoMatch, describe_node, gemm_operands, is_grouped, is_zero_fill, look_through,
                        same_kind, shape_of, size_eq)

aten = torch.ops.aten


def _pointwise(n: Any) -> bool:
    return (isinstance(n, torch.fx.Node) and n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
            and torch.Tag.pointwise in n.target.tags)


def _pointwise_cone(root: torch.fx.Node) -> tuple[list[torch.fx.Node], list[torch.fx.Node]]:
    """The pointwise nodes ``root`` is computed by (root included) and the tensors they start from."""
    nodes, leaves, stack = [], [], [root]
    while stack:
        n = stack.pop()
        if n in nodes or n in leaves:
            continue
        if _pointwise(n):
            nodes.append(n)
            stack.extend(n.all_input_nodes)
        else:
            leaves.append(n)
    return nodes, leaves


def _evaluate(root: torch.fx.Node, values: dict) -> torch.Tensor:
    """``root`` computed by its pointwise cone on real tensors given for its leaves."""
    memo = dict(values)

    def ev(n):
        if not isinstance(n, torch.fx.Node):
            return n
        if n not in memo:
            args = torch.fx.node.map_arg(n.args, ev)
            kwargs = torch.fx.node.map_arg(n.kwargs, ev)
            memo[n] = n.target(*args, **kwargs)
        return memo[n]

    return ev(root)


def _computes(root: torch.fx.Node, leaves: dict, want) -> bool:
    """Does ``root``'s pointwise cone compute ``want(**inputs)`` from the leaves (name -> node)? Checked
    on random float32 values in the leaves' dtypes, within their rounding (the graph's decomposed form
    and casts are whatever AOTAutograd and the compute dtype made them)."""
    gen = torch.Generator().manual_seed(0)
    with unset_fake_temporarily():
        raw = {name: torch.randn(64, generator=gen) * 2 for name in leaves}
        vals = {node: raw[name].to(val(node).dtype) for name, node in leaves.items()}
        try:
            got = _evaluate(root, vals).float()
        except Exception:  # noqa: BLE001 - an op that does not take these values is not the formula
            return False
        ref = want(**{name: vals[node].float() for name, node in leaves.items()})
        low = any(val(n).dtype in (torch.bfloat16, torch.float16) for n in [root, *leaves.values()])
        return got.shape == ref.shape and bool(torch.allclose(got, ref, rtol=3e-2 if low else 1e-5,
                                                               atol=3e-2 if low else 1e-5))


def _silu_grad(g):
    s = torch.sigmoid(g)
    return s * (1 + g * (1 - s))


def fused_grad_halves(d: Any) -> tuple[torch.fx.Node, torch.fx.Node, list[torch.fx.Node]] | None:
    """``d`` as the gradient of a fused gate/up GEMM's output, the two halves' gradients concatenated
    along the last dim: ``(first half, second half, nodes)`` for ``cat([a, b], -1)``, or
    ``slice_scatter(zeros, a, -1, 0, F) + slice_scatter(zeros, b, -1, F, 2F)`` (a slice's gradient)."""
    if not isinstance(d, torch.fx.Node):
        return None
    rank = len(shape_of(d))
    if d.target is aten.cat.default and len(d.args[0]) == 2 and arg(d, 1, "dim", 0) % rank == rank - 1:
        a, b = d.args[0]
        if isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node) and shape_eq_last(a, b):
            return a, b, [d]
        return None
    if _plain_add(d):
        width = shape_of(d)[-1]
        parts = {}
        for p in d.args[:2]:
            if not (isinstance(p, torch.fx.Node) and p.target is aten.slice_scatter.default and _is_zeros(p.args[0])
                    and arg(p, 2, "dim", 0) % rank == rank - 1 and arg(p, 5, "step", 1) == 1
                    and isinstance(width, int) and width % 2 == 0):
                return None
            start, end = arg(p, 3, "start", 0), arg(p, 4, "end")
            start = 0 if start is None else start
            end = width if end is None or (isinstance(end, int) and end >= width) else end
            if (start, end) == (0, width // 2):
                parts[0] = p
            elif (start, end) == (width // 2, width):
                parts[1] = p
        if sorted(parts) == [0, 1]:
            return parts[0].args[1], parts[1].args[1], [d, parts[0], parts[1], parts[0].args[0], parts[1].args[0]]
    return None


def shape_eq_last(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    sa, sb = shape_of(a), shape_of(b)
    return len(sa) == len(sb) and all(size_eq(x, y) for x, y in zip(sa, sb))


def _is_fused_grad_gemm(n: Any, kinds) -> bool:
    """``n = kind(cat(dG, dU), Wt)``: a fused gate/up GEMM's input gradient."""
    n = look_through(n)
    return (isinstance(n, torch.fx.Node) and any(same_kind(n.target, k) for k in kinds)
            and fused_grad_halves(look_through(n.args[0])) is not None)


def _one_expert_grads(dx: torch.fx.Node, kinds) -> dict:
    """``dx = dG @ Wg^T + dU @ Wu^T`` (one GEMM kind from ``kinds``) with ``dG``, ``dU`` the SwiGLU
    gradients of ``dA = dY @ Wd^T``; or ``dx = cat(dG, dU) @ Wt`` for a fused gate/up weight (either
    half first). For ``mm`` the sum may be one ``addmm(mm(...), ·, ·)``: Inductor's post-grad
    patterns fold ``mm + mm`` so before the pass runs."""
    fused, joins, views = [], [], []  # views: no-op views around the GEMMs (x @ w), in the region
    if _is_fused_grad_gemm(dx, kinds):
        kind = next(k for k in kinds if same_kind(look_through(dx).target, k))
        d_cat, wt, offs = gemm_operands(dx, kind, views)
        first, second, joins = fused_grad_halves(d_cat)
        terms = [(look_through(dx), first, wt, offs), (look_through(dx), second, wt, offs)]
        fused = [d_cat]
    elif _plain_addmm(dx) and aten.mm.default in kinds:
        c, a, b = dx.args[:3]
        if not (isinstance(c, torch.fx.Node) and c.target is aten.mm.default):
            raise NoMatch(f"{dx.name} adds {describe_node(c)} to an expert GEMM, not another expert GEMM")
        kind = aten.mm.default
        terms = [(c, *gemm_operands(c, kind)), (dx, a, b, None)]
    else:
        if not _plain_add(dx):
            raise NoMatch(f"an expert's input gradient is {describe_node(dx)}, not the sum of two GEMMs")
        a, b = look_through(dx.args[0], views), look_through(dx.args[1], views)
        if not all(isinstance(x, torch.fx.Node) and any(same_kind(x.target, k) for k in kinds) for x in (a, b)) \
                or a.target is not b.target:
            raise NoMatch(f"{dx.name} does not add two expert GEMMs ({describe_node(a)}, {describe_node(b)})")
        kind = a.target
        terms = [(gemm, *gemm_operands(gemm, kind, views)) for gemm in (a, b)]
    branches = []
    for i, (gemm, lhs, w, offs) in enumerate(terms):
        cone, leaves = _pointwise_cone(lhs)
        branches.append((gemm, lhs, w, offs, cone, leaves, i))
    # dU's cone reads dA and G; dG's reads dA, U and G
    branches.sort(key=lambda br: len(br[5]))
    (g_up, d_up, wt_up, offs_u, cone_u, leaves_u, _), (g_gate, d_gate, wt_gate, offs_g, cone_g, leaves_g, i_gate) = \
        branches
    gate_first = i_gate == 0
    # dA: the leaf both cones read that is (a no-op view of) the GEMM with the down weight
    d_act = next((n for n in leaves_u if n in leaves_g and isinstance(look_through(n), torch.fx.Node)
                  and same_kind(look_through(n).target, kind)), None)
    if d_act is None or len(leaves_u) != 2 or len(leaves_g) != 3:
        raise NoMatch(f"the gradients {d_up.name}, {d_gate.name} of the two expert GEMMs are not computed from one "
                      "gradient GEMM and the saved gate and up")
    gate = next(n for n in leaves_u if n is not d_act)
    others = [n for n in leaves_g if n is not d_act and n is not gate]
    if len(others) != 1:
        raise NoMatch(f"{d_gate.name} does not read the gate {gate.name} that {d_up.name} reads")
    (up,) = others
    if not _computes(d_up, {"da": d_act, "g": gate}, lambda da, g: da * g * torch.sigmoid(g)):
        raise NoMatch(f"{d_up.name} is not dA * silu(gate) ({d_act.name}, {gate.name})")
    if not _computes(d_gate, {"da": d_act, "g": gate, "u": up}, lambda da, g, u: da * u * _silu_grad(g)):
        raise NoMatch(f"{d_gate.name} is not silu'(gate) * dA * up ({d_act.name}, {gate.name}, {up.name})")
    dy, wt_down, offs_d = gemm_operands(d_act, kind, views)
    if is_grouped(kind) and not (offs_d is offs_u is offs_g and isinstance(offs_d, torch.fx.Node)):
        raise NoMatch("the three grouped gradient GEMMs do not share one offs tensor")
    gemms = list(dict.fromkeys([look_through(d_act), g_gate, g_up]))
    return dict(kind=kind, dy=dy, d_act=d_act, d_gate=d_gate, d_up=d_up, gate=gate, up=up, wt_gate=wt_gate,
                wt_up=wt_up, wt_down=wt_down, gemms=gemms,
                inner=list(dict.fromkeys(cone_u + cone_g + joins[1:] + views)),
                offs=offs_d, d_fused=fused, gate_first=gate_first)


def _plain_addmm(n: Any) -> bool:
    """``n = c + a @ b`` (``aten.addmm`` with ``beta`` and ``alpha`` 1)."""
    return (isinstance(n, torch.fx.Node) and n.target is aten.addmm.default and arg(n, 3, "beta", 1) == 1
            and arg(n, 4, "alpha", 1) == 1)


def _plain_add(n: Any) -> bool:
    """``n = a + b`` (``aten.add.Tensor`` without a scaling ``alpha``)."""
    return isinstance(n, torch.fx.Node) and n.target is aten.add.Tensor and arg(n, 2, "alpha", 1) == 1


def _is_zeros(n: Any) -> bool:
    return isinstance(n, torch.fx.Node) and n.target in (aten.full.default, aten.zeros.default) and is_zero_fill(n)


def _loop_terms(out: torch.fx.Node) -> tuple[list[torch.fx.Node], list[torch.fx.Node]]:
    """The loop form's per-expert input gradients, in expert order, and the nodes that assemble them:
    ``cat([dX_0, dX_1, ...])``, or a sum of ``select_scatter(zeros, dX_e, 0, e)``."""
    if out.target is aten.cat.default:
        if arg(out, 1, "dim", 0) != 0:
            raise NoMatch(f"the experts' input gradients are concatenated along dim {arg(out, 1, 'dim', 0)}")
        return list(out.args[0]), [out]
    terms, joins, stack = {}, [], [out]
    while stack:
        n = stack.pop()
        if not isinstance(n, torch.fx.Node):
            raise NoMatch(f"the input gradients add {n!r}")
        if _plain_add(n) and all(isinstance(x, torch.fx.Node) and x.target in (
                aten.add.Tensor, aten.select_scatter.default) for x in n.args[:2]):
            joins.append(n)
            stack.extend(n.args[:2])
        elif n.target is aten.select_scatter.default and arg(n, 2, "dim") == 0 and _is_zeros(n.args[0]):
            e = arg(n, 3, "index")
            if not isinstance(e, int) or e in terms:
                raise NoMatch(f"{n.name} places an expert's input gradient at {e!r} twice or at a symbolic index")
            joins.append(n)
            terms[e] = n.args[1]
        else:
            raise NoMatch(f"the experts' input gradients are assembled by {describe_node(n)}, not select_scatter / add / cat")
    if sorted(terms) != list(range(len(terms))):
        raise NoMatch(f"the loop's input gradients are placed at experts {sorted(terms)}")
    return [terms[e] for e in range(len(terms))], joins


def _grad_pieces(pieces: list) -> tuple[torch.fx.Node, list, list]:
    """The loop's per-expert dY rows: ``select(dY, 0, e)`` or consecutive ``slice(dY, 0, start, end)``
    of one tensor, in expert order: ``(dY, group sizes, slice bounds)``."""
    base = pieces[0].args[0] if isinstance(pieces[0], torch.fx.Node) else None
    if all(isinstance(p, torch.fx.Node) and p.target is aten.select.int and p.args[0] is base
           and arg(p, 1, "dim") == 0 and arg(p, 2, "index") == e for e, p in enumerate(pieces)):
        shape = shape_of(base)
        if len(shape) != 3 or not size_eq(shape[0], len(pieces)):
            raise NoMatch(f"the loop selects {len(pieces)} experts' gradients from a tensor of shape {shape}")
        return base, [shape[1]] * len(pieces), []
    bounds = []
    for e, p in enumerate(pieces):
        if not (isinstance(p, torch.fx.Node) and p.target is aten.slice.Tensor and p.args[0] is base
                and arg(p, 1, "dim", 0) == 0 and arg(p, 4, "step", 1) == 1):
            raise NoMatch(f"expert {e}'s result gradient {describe_node(p)} is not a select or slice of one tensor")
        start, end = arg(p, 2, "start", 0), arg(p, 3, "end")
        size = (lambda x: val(x) if isinstance(x, torch.fx.Node) else x)  # noqa: E731
        if (e == 0 and not size_eq(size(start), 0)) or (e > 0 and start is not bounds[-1][1]
                                                        and not size_eq(size(start), size(bounds[-1][1]))):
            raise NoMatch(f"the loop's gradient slices are not consecutive ({p.name} starts at {start!r})")
        bounds.append((start, end))
    return base, [None] * len(pieces), bounds


def match_expert_grads(out: torch.fx.Node) -> ExpertGrads:
    """The experts' input gradients ``out`` of a backward graph, in any of the three forms."""
    batched = (aten.bmm.default, aten._grouped_mm.default)
    if _is_fused_grad_gemm(out, batched) or (_plain_add(out) and all(
            isinstance(look_through(x), torch.fx.Node)
            and (look_through(x).target is aten.bmm.default or is_grouped(look_through(x).target))
            for x in out.args[:2])):
        g = _one_expert_grads(out, batched)
        form = "bmm" if g["kind"] is aten.bmm.default else "grouped_mm"
        sizes = None
        if form == "bmm":
            shape = val(g["dy"]).shape
            sizes = [shape[1]] * shape[0]
        return ExpertGrads(
            form=form, dy=g["dy"], d_act=[g["d_act"]], d_gate=[g["d_gate"]], d_up=[g["d_up"]], gate=[g["gate"]],
            up=[g["up"]], wt_gate=[g["wt_gate"]], wt_up=[g["wt_up"]], wt_down=[g["wt_down"]], dx_out=out,
            gemms=g["gemms"], inner=g["inner"], offsets=g["offs"] if form == "grouped_mm" else None, group_sizes=sizes,
            d_fused=g["d_fused"], gate_first=g["gate_first"],
        )
    terms, joins = _loop_terms(out)
    per = [_one_expert_grads(t, (aten.mm.default,)) for t in terms]
    if len({bool(p["d_fused"]) for p in per}) != 1 or len({p["gate_first"] for p in per}) != 1:
        raise NoMatch("the loop's experts do not all compute gate and up the same way (fused, half order)")
    dy, sizes, bounds = _grad_pieces([p["dy"] for p in per])
    return ExpertGrads(
        form="loop", dy=dy, d_act=[p["d_act"] for p in per], d_gate=[p["d_gate"] for p in per],
        d_up=[p["d_up"] for p in per], gate=[p["gate"] for p in per], up=[p["up"] for p in per],
        wt_gate=[p["wt_gate"] for p in per], wt_up=[p["wt_up"] for p in per], wt_down=[p["wt_down"] for p in per],
        dx_out=out, gemms=[n for p in per for n in p["gemms"]], inner=[n for p in per for n in p["inner"]] + terms,
        group_sizes=sizes, pieces=[p["dy"] for p in per], bounds=bounds, joins=joins,
        d_fused=[n for p in per for n in p["d_fused"]], gate_first=per[0]["gate_first"],
    )


def is_expert_grads(out: torch.fx.Node) -> bool:
    """Is ``out`` (where the walk from a combine input stopped) a backward's experts' input gradients:
    an ``add`` (of GEMMs, or of placed per-expert gradients) or a ``cat`` of per-expert sums (``add``,
    or ``addmm`` where Inductor folded ``mm + mm``)?"""
    if out.target is aten.add.Tensor or _is_fused_grad_gemm(out, (aten.bmm.default, aten._grouped_mm.default)):
        return True
    return out.target is aten.cat.default and all(
        isinstance(t, torch.fx.Node) and (t.target in (aten.add.Tensor, aten.addmm.default)
                                          or _is_fused_grad_gemm(t, (aten.mm.default,))) for t in out.args[0])
