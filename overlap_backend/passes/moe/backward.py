"""The backward direction of the MoE pass: a backward graph's all-to-all pair around the experts'
input gradients (``ExpertGrads``), checked and rewritten into one ``overlap.moe_experts_backward`` in
all three forms, the weight gradients staying in the graph."""

from __future__ import annotations

import operator

import torch
import torch.fx

from ..fx import erase_dead, hoist_before, val
from ..manager import OverlapPass
from ..preconditions import require_dtype
from ..rejected import Rejected
from .region import (FakeNodes, Region, check_region, check_row_dtypes, decide_lowering, fused_halves,
                     only_row_counts, region_of, replace_row_counts, row_ids, stack_experts)
from .structure import ExpertGrads, MoeMatch, look_through, shape_eq, shape_of, size_eq

aten = torch.ops.aten


def check(p: OverlapPass, m: MoeMatch, ws: int) -> str:
    """The expert gradients between a backward graph's all-to-alls (after the checks both directions
    share): ``moe_experts_backward``'s lowering to write."""
    d, g = m.dispatch, m.grads
    cd = val(g.d_act[0]).dtype
    require_dtype(g.dy, *g.d_gate, *g.d_up, *g.gate, *g.up, *g.wt_gate, *g.wt_up, *g.wt_down, *g.gemms,
                  *g.pieces)
    check_row_dtypes(m, cd, "the input gradient", "gradients")
    h = shape_of(d.wait)[-1]
    if g.form == "loop":
        shapes = {(shape_of(a), shape_of(b), shape_of(w)) for a, b, w in zip(g.wt_gate, g.wt_up, g.wt_down)}
        if len(shapes) != 1:
            raise Rejected(f"the loop's experts have weights of different shapes {sorted(shapes)}")
        wg, wu, wd = ((len(g.wt_gate), *x) for x in next(iter(shapes)))
    else:
        wg, wu, wd = shape_of(g.wt_gate[0]), shape_of(g.wt_up[0]), shape_of(g.wt_down[0])
    if g.d_fused:
        if len(wg) != 3 or not isinstance(wg[1], int) or wg[1] % 2:
            raise Rejected(f"the fused gate/up weight (transposed) {wg} is not [E, 2F, {h}]")
        wg = wu = (wg[0], wg[1] // 2, wg[2])
    if len(wg) != 3 or not shape_eq(wg, wu) or not shape_eq(wd, (wg[0], wg[2], wg[1])) or not size_eq(wg[2], h):
        raise Rejected(f"expert weights (transposed) {wg}, {wu}, {wd} are not [E, F, {h}], [E, F, {h}], [E, {h}, F]")
    for i, (gt, ut) in enumerate(zip(g.gate, g.up)):
        rows = shape_of(g.pieces[i] if g.form == "loop" else g.dy)[:-1]
        gshape, ushape = shape_of(gt), shape_of(ut)
        if not shape_eq(gshape, ushape) or not shape_eq(gshape[:-1], rows) or not size_eq(gshape[-1], wg[1]):
            raise Rejected(f"the saved gate {gshape} and up {ushape} are not a row of F={wg[1]} per grouped row "
                           f"{rows}")
    if g.form == "grouped_mm" and not shape_eq(shape_of(g.offsets), (wg[0],)):
        raise Rejected(f"grouped GEMM offs of shape {shape_of(g.offsets)} for {wg[0]} experts")
    if g.form == "bmm" and not size_eq(shape_of(g.dy)[0], wg[0]):
        raise Rejected(f"bmm over {shape_of(g.dy)[0]} groups but {wg[0]} experts")
    check_region(p, m, _outside_grads, _grad_inputs(m), "the expert gradients", "received gradients")
    # no symm kernels for the gradients: p2p wherever the forward could run symm
    return decide_lowering(p, m, ws, "moe_experts_backward", g.dy, wg[1], wg[0], cd, False, 0).lowering


FUSED = -1  # _outside_grads: the fused gate/up gradient, dG | dU concatenated from the op's outputs 2 and 3


def _outside_grads(m: MoeMatch, region: Region) -> dict:
    """Region value -> (op output, expert or None) it is read as outside the region: dY, dG, dU (what
    the weight gradients read; the loop form's per expert); :class:`Rejected` for any other value."""
    g, d, c = m.grads, m.dispatch, m.combine
    if g.form == "loop":
        provided = {n: (i, e) for i, group in ((1, g.pieces), (2, g.d_gate), (3, g.d_up), (FUSED, g.d_fused))
                    for e, n in enumerate(group)}
    else:
        provided = {g.dy: (1, None), g.d_gate[0]: (2, None), g.d_up[0]: (3, None)}
        if g.d_fused:
            provided[g.d_fused[0]] = (FUSED, None)
    for n, users in region.outside.items():
        if n is c.wait or n in provided:
            continue
        if look_through(n) in provided:  # a view of a provided value to its own shape (x @ w's)
            provided[n] = provided[look_through(n)]
            continue
        if n in (d.collective, c.collective):
            only_row_counts(n, users)
            continue
        raise Rejected(f"{n.name} (between the all-to-alls) is also read outside by {[u.name for u in users]}")
    return provided


def _grad_inputs(m: MoeMatch) -> list[torch.fx.Node]:
    g = m.grads
    nodes = [m.dispatch.input] + list(m.dispatch.output_splits) + list(m.dispatch.input_splits)
    nodes += [i for s in m.in_steps for i in (s.index or [])]
    nodes += [s.base for s in m.in_steps if s.base is not None]
    nodes += g.gate + g.up + g.wt_gate + g.wt_up + g.wt_down + ([g.offsets] if g.offsets is not None else [])
    nodes += list(g.group_sizes or []) + [b for bound in g.bounds for b in bound]
    return [n for n in nodes if isinstance(n, torch.fx.Node)]


def rewrite(m: MoeMatch, lowering: str) -> None:
    """Replace the backward block by one ``moe_experts_backward`` op; the weight gradients stay in the
    graph and read its dY, dG, dU outputs."""
    d, c, g = m.dispatch, m.combine, m.grads
    graph = c.wait.graph
    region = region_of(m)
    provided = _outside_grads(m, region)
    order = {n: i for i, n in enumerate(graph.nodes)}
    readers = [u for n in provided for u in region.outside.get(n, [])]
    anchor = min([c.wait] + readers, key=order.__getitem__)
    hoist_before(anchor, _grad_inputs(m))
    fake = FakeNodes(d.wait)
    with graph.inserting_before(anchor):
        rows = row_ids(graph, fake, m)
        f = shape_of(g.gate[0])[-1]

        def flat(nodes):  # the saved values as [M, F] (the loop's per-expert pieces concatenated: a copy)
            parts = [x if len(shape_of(x)) == 2 else fake.call(graph, aten.reshape.default, (x, [-1, f]))
                     for x in nodes]
            return parts[0] if len(parts) == 1 else fake.call(graph, aten.cat.default, (parts,))

        sizes = []
        if g.offsets is None:
            for e, size in enumerate(g.group_sizes):
                if size is None:  # a slice's rows: end - start
                    start, end = g.bounds[e]
                    size = end if isinstance(start, int) and start == 0 else fake.call(
                        graph, operator.sub, (end, start))
                sizes.append(size)
        wt_down = stack_experts(graph, fake, g.wt_down)
        if g.d_fused:  # views of the fused transposed weight [E, 2F, H]: no copy
            wt_gate, wt_up = fused_halves(graph, fake, stack_experts(graph, fake, g.wt_gate), 1, g.gate_first)
        else:
            wt_gate, wt_up = stack_experts(graph, fake, g.wt_gate), stack_experts(graph, fake, g.wt_up)
        op = fake.call(
            graph, torch.ops.overlap.moe_experts_backward.default,
            (d.input, list(d.input_splits), list(d.output_splits), rows, g.offsets, sizes, flat(g.gate),
             flat(g.up), wt_gate, wt_up, wt_down, c.group_name, lowering),
        )
        dx = fake.call(graph, operator.getitem, (op, 0))
        outs: dict[int, torch.fx.Node] = {}
        per_expert: dict[int, torch.fx.Node] = {}  # an output as [E, rows, X] (the loop over selects)
        for n, (i, e) in provided.items():
            users = region.outside.get(n, [])
            if not users:
                continue
            if i == FUSED:  # the weight gradient's cat(dG, dU): from the op's dG and dU, as the graph had it
                if FUSED not in outs:
                    for j in (2, 3):
                        outs.setdefault(j, fake.call(graph, operator.getitem, (op, j)))
                    halves = [outs[2], outs[3]]
                    outs[FUSED] = fake.call(graph, aten.cat.default, (halves if g.gate_first else halves[::-1], -1))
            elif i not in outs:
                outs[i] = fake.call(graph, operator.getitem, (op, i))
            new = _expert_rows(graph, fake, g, outs[i], n, e, per_expert, i)
            for u in users:
                u.replace_input_with(n, new)
    c.wait.replace_all_uses_with(dx)
    replace_row_counts(graph, fake, m)
    # the SwiGLU derivative's nodes that read only the saved gate/up lie outside the region: dead now too,
    # as are the loop's per-expert transposed weights
    erase_dead(sorted(region.dying | set(g.inner) | set(g.wt_gate + g.wt_up + g.wt_down),
                      key=lambda n: -order[n]))


def _expert_rows(graph, fake, g: ExpertGrads, flat: torch.fx.Node, like: torch.fx.Node,
                 expert: int | None, per_expert: dict, key: int) -> torch.fx.Node:
    """An op output ([M, X], grouped rows) as the graph read ``like``: reshaped, or expert ``expert``'s
    rows (``per_expert[key]``: the output viewed [E, rows, X] once, for the loop over selects)."""
    if expert is None:
        if shape_eq(shape_of(flat), shape_of(like)):
            return flat
        return fake.call(graph, aten.reshape.default, (flat, list(shape_of(like))))
    if g.bounds:
        start, end = g.bounds[expert]
        return fake.call(graph, aten.slice.Tensor, (flat, 0, start, end))
    if key not in per_expert:
        per_expert[key] = fake.call(graph, aten.reshape.default,
                                    (flat, [len(g.pieces), g.group_sizes[0], shape_of(flat)[-1]]))
    return fake.call(graph, aten.select.int, (per_expert[key], 0, expert))
