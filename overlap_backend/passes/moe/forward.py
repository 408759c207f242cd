"""The forward direction of the MoE pass: the checks of a forward block and its rewrite into one
``overlap.moe_experts`` op.

Values of the matched region that the rest of the graph still reads (what a training forward saves
for backward: the grouped input, G, U, A, and views of them) are taken from the op's ``saved``
outputs or recomputed from them by copying the cheap nodes in between; the down projection's output
and what follows it may not be read elsewhere.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from ...runtime.ops import MOE_SAVED
from ...spec import knobs
from ..fx import erase_dead, hoist_before, val
from ..manager import OverlapPass
from ..preconditions import require_dtype
from ..rejected import Rejected
from .region import (FakeNodes, Region, check_region, check_row_dtypes, decide_lowering, fused_halves,
                     only_row_counts, region_of, replace_row_counts, row_ids, stack_experts)
from .structure import MoeMatch, shape_eq, shape_of, size_eq

aten = torch.ops.aten


def check(p: OverlapPass, m: MoeMatch, ws: int) -> str:
    """The forward block (after the checks both directions share): dtypes, weights, the region, and the
    decision; the lowering to write, with ``m.comm_sms`` set."""
    e = m.experts
    _check_dtypes(m)
    _check_weights(m)
    # raises Rejected for values read outside that cannot be provided
    need = check_region(p, m, _plan_outside, _op_inputs(m), "the expert block", "dispatched rows")
    wg = _gate_shape(e)
    experts = len(e.w_gate) if e.form == "loop" else wg[0]
    # symm runs as p2p where its kernels are off (knobs.moe.ENABLED) and where the op hands out saved values
    decision = decide_lowering(p, m, ws, "moe_experts", e.grouped, wg[-1], experts, val(e.gate[0]).dtype,
                               knobs.moe.ENABLED and not need, p.ctx.config.moe_comm_sms)
    m.comm_sms = decision.comm_sms  # the model's pick where the setting is auto
    if m.comm_sms < 0 and isinstance(p.ctx.config.moe_comm_sms, int):
        # the backend's setting, fixed when the graph is compiled as cta_stages is (else the op would read
        # OVERLAP_MOE_COMM_SMS per call and silently ignore make_backend(moe_comm_sms=...))
        m.comm_sms = p.ctx.config.moe_comm_sms
    return decision.lowering


def _gate_shape(e) -> tuple:
    """The shape of (one loop expert's) gate weight: ``[., H, F]``, half of a fused ``[., H, 2F]``."""
    shape = shape_of(e.w_gate[0])
    return (*shape[:-1], shape[-1] // 2) if e.fused else shape


def _check_dtypes(m: MoeMatch) -> None:
    e = m.experts
    require_dtype(*e.gate, *e.up, *e.act, *e.down, *e.w_gate, *e.w_up, *e.w_down,
                  *(e.pieces or [e.grouped]))
    check_row_dtypes(m, val(e.gate[0]).dtype, "the experts' output", "tokens")


def _check_weights(m: MoeMatch) -> None:
    e = m.experts
    h = shape_of(m.dispatch.wait)[-1]
    if e.form == "loop":
        shapes = {(shape_of(g), shape_of(u), shape_of(w)) for g, u, w in zip(e.w_gate, e.w_up, e.w_down)}
        if len(shapes) != 1:
            raise Rejected(f"the loop's experts have weights of different shapes {sorted(shapes)}")
        (g, u, w), experts = next(iter(shapes)), len(e.w_gate)
        g, u, w = (experts, *g), (experts, *u), (experts, *w)
    else:
        g, u, w = shape_of(e.w_gate[0]), shape_of(e.w_up[0]), shape_of(e.w_down[0])
    if e.fused:
        if len(g) != 3 or not isinstance(g[2], int) or g[2] % 2:
            raise Rejected(f"the fused gate/up weight {g} is not [E, {h}, 2F]")
        g = u = (*g[:2], g[2] // 2)
    if len(g) != 3 or not shape_eq(g, u) or not shape_eq(w, (g[0], g[2], g[1])) or not size_eq(g[1], h):
        raise Rejected(f"expert weights {g}, {u}, {w} are not [E, {h}, F], [E, {h}, F], [E, F, {h}]")
    if e.form == "grouped_mm" and not shape_eq(shape_of(e.offsets), (g[0],)):
        raise Rejected(f"grouped GEMM offs of shape {shape_of(e.offsets)} for {g[0]} experts")
    if e.form == "bmm" and not size_eq(shape_of(e.grouped)[0], g[0]):
        raise Rejected(f"bmm over {shape_of(e.grouped)[0]} groups but {g[0]} experts")


def _roles(m: MoeMatch) -> dict:
    """Region node -> (saved value, expert index or None) for the values the op can hand out."""
    e = m.experts
    roles = {m.dispatch.wait: ("recv", None)}
    cd = val(e.gate[0]).dtype
    if val(e.grouped).dtype == cd:
        roles[e.grouped] = ("xg", None)
    for name, group in (("gate", e.gate), ("up", e.up), ("act", e.act), ("fused", e.fused)):
        for i, n in enumerate(group):
            roles[n] = (name, i if e.form == "loop" else None)
    if e.form == "loop":
        for i, p in enumerate(e.pieces):
            if val(p).dtype == cd:
                roles.setdefault(p, ("xg", i))
    return roles


def _plan_outside(m: MoeMatch, region: Region) -> set[str]:
    """The saved values the op must return; :class:`Rejected` when a read value cannot be provided."""
    roles = _roles(m)
    d, c = m.dispatch, m.combine
    forbidden = {m.experts.down_out, *m.experts.down, c.collective, *(s.node for s in m.out_steps)}
    need: set[str] = set()

    def visit(n: torch.fx.Node, seen: set) -> None:
        if n in roles:
            name = roles[n][0]
            need.update(("gate", "up") if name == "fused" else (name,))  # G|U: the two concatenated
            return
        if n not in region.nodes or n in seen:
            return
        if n in forbidden or n is d.collective:
            raise Rejected(f"{n.name} (after the expert GEMMs) is also read outside the expert block")
        seen.add(n)
        for inp in n.all_input_nodes:
            visit(inp, seen)

    for n, users in region.outside.items():
        if n is c.wait:
            continue
        if n in (d.collective, c.collective):
            only_row_counts(n, users)
            continue
        if n in forbidden:
            raise Rejected(f"{n.name} (the experts' output) is also used by {[u.name for u in users]}")
        visit(n, set())
    return need


def _op_inputs(m: MoeMatch) -> list[torch.fx.Node]:
    e = m.experts
    nodes = [m.dispatch.input] + [x for x in m.dispatch.output_splits + m.dispatch.input_splits]
    nodes += [i for s in m.in_steps for i in (s.index or [])]
    nodes += [s.base for s in m.in_steps if s.base is not None]
    nodes += e.w_gate + e.w_up + e.w_down + ([e.offsets] if e.offsets is not None else [])
    nodes += list(e.group_sizes or [])
    return [n for n in nodes if isinstance(n, torch.fx.Node)]


def rewrite(m: MoeMatch, lowering: str) -> None:
    """Replace the forward block by one ``moe_experts`` op; the region's values read outside come from
    its saved outputs."""
    d, c, e = m.dispatch, m.combine, m.experts
    graph = c.wait.graph
    region = region_of(m)
    need = _plan_outside(m, region)
    order = {n: i for i, n in enumerate(graph.nodes)}
    readers = [u for n, users in region.outside.items() if n not in (d.collective, c.collective) for u in users]
    anchor = min([c.wait] + readers, key=order.__getitem__)
    hoist_before(anchor, _op_inputs(m))
    fake = FakeNodes(d.wait)
    with graph.inserting_before(anchor):
        rows = row_ids(graph, fake, m)
        w_down = stack_experts(graph, fake, e.w_down)
        if e.fused:  # views of the fused weight: no copy
            w_gate, w_up = fused_halves(graph, fake, stack_experts(graph, fake, e.w_gate), 2, e.gate_first)
        else:
            w_gate, w_up = stack_experts(graph, fake, e.w_gate), stack_experts(graph, fake, e.w_up)
        saved = [name in need for name in MOE_SAVED]
        op = fake.call(
            graph, torch.ops.overlap.moe_experts.default,
            (d.input, list(d.input_splits), list(d.output_splits), rows, e.offsets,
             [] if e.offsets is not None else list(e.group_sizes), w_gate, w_up, w_down,
             c.group_name, lowering, saved, *((m.comm_sms,) if m.comm_sms >= 0 else ())),
        )
        out = fake.call(graph, operator.getitem, (op, 0))
        values = fake.call(graph, operator.getitem, (op, 1))
        provided = {name: fake.call(graph, operator.getitem, (values, i)) for i, name in enumerate(MOE_SAVED) if saved[i]}
        _provide_outside(graph, fake, m, region, provided)
    c.wait.replace_all_uses_with(out)
    replace_row_counts(graph, fake, m)
    erase_dead(sorted(region.dying | set(e.w_gate + e.w_up + e.w_down), key=lambda n: -order[n]))


def _provide_outside(graph, fake, m: MoeMatch, region: Region, provided: dict) -> None:
    """Point every outside reader of a region value at the op's saved values (or a copy of the
    cheap nodes between them)."""
    roles = _roles(m)
    e = m.experts
    cache: dict[torch.fx.Node, torch.fx.Node] = {}
    per_expert: dict[torch.fx.Node, torch.fx.Node] = {}  # a saved value split into the loop's experts

    def flat_to(flat: torch.fx.Node, like: torch.fx.Node, expert: int | None) -> torch.fx.Node:
        if expert is None:
            if shape_eq(shape_of(like), shape_of(flat)):
                return flat
            return fake.call(graph, aten.reshape.default, (flat, list(shape_of(like))))
        if e.split is not None:
            if flat not in per_expert:
                per_expert[flat] = fake.call(graph, aten.split_with_sizes.default, (flat, list(e.group_sizes)))
            return fake.call(graph, operator.getitem, (per_expert[flat], expert))
        if flat not in per_expert:
            shape = [len(e.gate), e.group_sizes[0], shape_of(flat)[-1]]
            per_expert[flat] = fake.call(graph, aten.reshape.default, (flat, shape))
        return fake.call(graph, aten.select.int, (per_expert[flat], 0, expert))

    def get(n: torch.fx.Node) -> torch.fx.Node:
        if n in cache:
            return cache[n]
        if n in roles:
            name, expert = roles[n]
            if name == "fused" and "fused" not in provided:  # the fused GEMM's output: G | U (or U | G)
                halves = [provided["gate"], provided["up"]]
                provided["fused"] = fake.call(graph, aten.cat.default, (halves if e.gate_first else halves[::-1], -1))
            new = flat_to(provided[name], n, expert)
        elif n in region.nodes:
            new = graph.node_copy(n, lambda x: get(x) if x in region.nodes else x)
            new.meta = dict(n.meta)
        else:
            return n
        cache[n] = new
        return new

    c = m.combine
    for n, users in region.outside.items():
        if n in (c.wait, c.collective, m.dispatch.collective):
            continue
        new = get(n)
        for u in users:
            u.replace_input_with(n, new)
