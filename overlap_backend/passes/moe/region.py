"""What the two directions of the MoE rewrite share: the region between the all-to-alls (what it
holds, what dies with it, what the rest of the graph reads of it), the checks on it, the decision, the
row ids the op gets, and the nodes that replace the all-to-alls' row counts."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.fx

from ...cost import Decision, Problem
from ...runtime import available
from .. import lowerings
from ..fx import ancestors, arg, device_type, val
from ..manager import OverlapPass
from ..preconditions import require_dtype, require_min_numel
from ..rejected import Rejected
from ..sizes import hint
from .layout import layout_error
from .structure import FILLS, MoeMatch, is_static, shape_of

aten = torch.ops.aten
prims = torch.ops.prims


@dataclass
class Region:
    nodes: set  # every node between the dispatch and the combine, both included
    dying: set  # region nodes plus what only they use (fills, sym_size)
    outside: dict  # region node -> its users outside ``dying``
    known: set  # nodes the structural match accounts for


def region_of(m: MoeMatch) -> Region:
    """The region of ``m``: what lies between its all-to-alls, what dies with it, what is read outside."""
    d, c = m.dispatch, m.combine
    up_from_combine = ancestors(c.wait) | {c.wait}
    nodes, stack = set(), [d.collective]
    while stack:
        n = stack.pop()
        if n in nodes or n not in up_from_combine:
            continue
        nodes.add(n)
        stack.extend(n.users)
    known = {d.collective, d.wait, c.collective, c.wait, m.out_node}
    known |= {s.node for s in m.in_steps + m.out_steps}
    if m.experts is not None:
        e = m.experts
        known |= {n for group in (e.gate, e.up, e.act, e.down, e.inner, e.pieces, e.fused) for n in group}
    else:
        g = m.grads
        known |= set(g.gemms + g.inner + g.pieces + g.joins + g.d_fused)
    bases = {s.base for s in m.in_steps + m.out_steps if s.base is not None}
    dying = set(nodes) | bases
    changed = True
    while changed:  # sym_size of region nodes feeding only the fills, etc.
        changed = False
        for n in list(dying):
            for u in n.users:
                if u not in dying and u.users and all(x in dying for x in u.users):
                    dying.add(u)
                    changed = True
    # sym_size nodes feeding a fill of the region are region nodes the match accounts for
    known |= {n for n in nodes if n.target is aten.sym_size.int and all(u in dying for u in n.users)}
    known |= {n for n in nodes if n in dying and n.target in FILLS}
    outside = {}
    for n in (x for x in c.wait.graph.nodes if x in nodes):  # graph order: the same rewrite on every rank and run
        users = [u for u in n.users if u not in dying]
        if users:
            outside[n] = users
    return Region(nodes, dying, outside, known)


def check_region(p: OverlapPass, m: MoeMatch, outside, inputs: list, what: str, received: str):
    """The checks both directions share: the row moves undo each other, nothing else is computed
    between the all-to-alls, values read outside can be provided (``outside(m, region)``, whose
    result is returned), the op's inputs do not depend on what the first all-to-all received, and
    the output's size."""
    if err := layout_error(m):
        raise Rejected(err)
    region = region_of(m)
    extra = region.nodes - region.known
    if extra:
        raise Rejected(f"the region between the all-to-alls also computes {sorted(n.name for n in extra)}")
    provided = outside(m, region)
    for n in inputs:
        if n in region.nodes or m.dispatch.wait in ancestors(n):
            raise Rejected(f"{n.name} (an input of {what}) depends on the {received}")
    out = shape_of(m.out_node)
    if is_static(out):
        require_min_numel(p.ctx, math.prod(out))
    return provided


def decide_lowering(p: OverlapPass, m: MoeMatch, ws: int, op: str, grouped: torch.fx.Node, f, experts, cd,
                    symm_runs: bool, comm_sms) -> Decision:
    """The decision for ``op`` (``moe_experts`` or its backward): its lowering (``p2p`` where the chosen
    one does not implement it), priced as the forward ``moe_experts`` problem of these shapes (the
    backward op does the same three GEMMs per grouped row and moves the same all-to-all bytes)."""
    d, c = m.dispatch, m.combine
    lowering = lowerings.choose_lowering(p.ctx, c.group_name, device_type(d.input))
    lowering = lowering if lowering in available(op) else "p2p"
    nodes = (d.input, d.wait, grouped, c.input)
    if p.ctx.captured(nodes) and (lowering == "p2p" or not symm_runs):
        # the p2p lowering reads the per-expert counts on the host: a CUDA-graph capture cannot
        raise Rejected(f"the graph is replayed from a CUDA graph and {op} would run on p2p, which reads the "
                       "per-expert row counts on the host (a synchronisation a capture cannot hold): the "
                       "all-to-alls are left to NCCL")
    gshape = shape_of(grouped)
    # the forward op's eager calls replay a private graph where every call sends the same (the backward's do not)
    fixed = op == "moe_experts" and all(isinstance(s, int) for s in (*d.output_splits, *d.input_splits))
    problem = Problem(
        "moe_experts", m=math.prod(hint(x) for x in gshape[:-1]), k=hint(gshape[-1]), n=hint(gshape[-1]),
        f=hint(f), experts=hint(experts), rows_sent=hint(shape_of(d.input)[0]), dtype=str(cd).removeprefix("torch."),
        ws=ws, fixed_splits=fixed,
    )
    return p.decide(problem, c.group_name, device_type(d.input), lowering, symm_runs=symm_runs, nodes=nodes,
                    comm_sms=comm_sms)


def row_ids(graph, fake, m: MoeMatch) -> torch.fx.Node:
    """``rows``: the in-chain row moves replayed on ``arange(N_recv)``."""
    recv = val(m.dispatch.wait)
    n = total_rows(graph, fake, m.dispatch.output_splits)
    # prims.iota, as decomposed graphs hold it (Inductor has no lowering for aten.arange)
    ids = fake.call(
        graph, prims.iota.default, (n,), dict(start=0, step=1, dtype=torch.int64, device=recv.device, requires_grad=False)
    )
    ids = fake.call(graph, aten.reshape.default, (ids, [n, 1]))
    for s in m.in_steps:
        if s.kind == "view":
            shape = list(s.node.args[1])
            ids = fake.call(graph, aten.reshape.default, (ids, shape[:-1] + [1]))
        elif s.kind == "permute":
            ids = fake.call(graph, aten.permute.default, (ids, list(s.node.args[1])))
        elif s.kind == "gather":
            ids = fake.call(graph, aten.index.Tensor, (ids, s.index))
        elif s.kind == "scatter":
            if s.base.op == "placeholder":  # a zero base the forward saved (passes/saved.py): its sizes
                shape = [d if isinstance(d, int) else fake.call(graph, aten.sym_size.int, (s.base, i))
                         for i, d in enumerate(shape_of(s.base))]
            else:
                shape = list(s.base.args[0])
            base = fake.call(graph, aten.full.default, (shape[:-1] + [1], -1), dict(dtype=torch.int64, device=recv.device))
            ids = fake.call(graph, aten.index_put.default, (base, s.index, ids))
    return fake.call(graph, aten.reshape.default, (ids, [-1]))


def same_splits(a: list, b: list) -> bool:
    """The same split sizes: the same nodes, or equal ints."""
    return len(a) == len(b) and all(x is y or (isinstance(x, int) and isinstance(y, int) and x == y) for x, y in zip(a, b))


def _is_row_count(node: torch.fx.Node) -> bool:
    return node.target is aten.sym_size.int and arg(node, 1, "dim") == 0


def check_row_dtypes(m: MoeMatch, cd: torch.dtype, out_what: str, rows_what: str) -> None:
    """The rows' dtypes around the block, either direction: the all-to-alls in a supported dtype, the
    grouped result (``m.out_node``) in the compute dtype ``cd``, casts only to ``cd`` or to the
    dispatched rows' dtype, and the combine sending what the dispatch sent."""
    require_dtype(m.dispatch.input, m.dispatch.wait, m.combine.input)
    out = m.out_node
    if val(out).dtype != cd:
        raise Rejected(f"{out_what} {out.name} is {val(out).dtype}, not {cd}")
    xdtype = val(m.dispatch.input).dtype
    for s in m.in_steps + m.out_steps:
        if s.kind == "cast" and val(s.node).dtype not in (cd, xdtype):
            raise Rejected(f"{s.node.name} casts rows to {val(s.node).dtype} (compute {cd}, {rows_what} {xdtype})")
    if xdtype != val(m.combine.input).dtype:
        raise Rejected(f"the combine sends {val(m.combine.input).dtype} rows, the dispatch {xdtype}")


def only_row_counts(collective: torch.fx.Node, users: list) -> None:
    """An all-to-all of the block may be read outside it only by ``sym_size(·, 0)`` (its row count)."""
    bad = [u.name for u in users if not _is_row_count(u)]
    if bad:
        raise Rejected(f"the all-to-all {collective.name} is also read by {bad}")


def replace_row_counts(graph, fake, m: MoeMatch) -> None:
    """``sym_size(all_to_all, 0)`` (the row counts a forward saves for backward) becomes the sum of its splits."""
    for coll, splits in ((m.dispatch.collective, m.dispatch.output_splits), (m.combine.collective, m.combine.output_splits)):
        for u in list(coll.users):
            if _is_row_count(u):
                with graph.inserting_before(u):
                    u.replace_all_uses_with(total_rows(graph, fake, splits))
                graph.erase_node(u)


def total_rows(graph, fake, splits: list):
    """The sum of ``splits`` (an int, or a node computing it)."""
    if all(isinstance(s, int) for s in splits):
        return sum(splits)
    return fake.call(graph, torch.sym_sum, (list(splits),))


def _expert_of(w: torch.fx.Node) -> tuple[torch.fx.Node, int, bool] | None:
    """A loop expert's 2-D weight as ``(W, e, transposed)``: ``select(W, 0, e)`` under any number of
    ``permute(., [1, 0])`` (``transposed``: an odd number of them)."""
    flips = 0
    while isinstance(w, torch.fx.Node) and w.target is aten.permute.default and list(w.args[1]) == [1, 0]:
        w, flips = w.args[0], flips + 1
    if isinstance(w, torch.fx.Node) and w.target is aten.select.int and arg(w, 1, "dim") == 0:
        e = arg(w, 2, "index")
        if isinstance(e, int):
            return w.args[0], e, flips % 2 == 1
    return None


def stack_experts(graph, fake, weights: list[torch.fx.Node]) -> torch.fx.Node:
    """The experts' weights as one ``[E, ., .]`` tensor: the 3-D weight itself, the tensor the loop's
    per-expert ``select`` (and ``permute``: then a permuted view) read in expert order (no copy), else
    stacked (a copy per call)."""
    if len(weights) == 1 and val(weights[0]).dim() == 3:
        return weights[0]
    found = [_expert_of(w) for w in weights]
    if all(f is not None for f in found):
        bases, flips = {f[0] for f in found}, {f[2] for f in found}
        (base,) = bases if len(bases) == 1 else (None,)
        if (base is not None and len(flips) == 1 and [f[1] for f in found] == list(range(len(weights)))
                and val(base).dim() == 3 and val(base).shape[0] == len(weights)):
            return fake.call(graph, aten.permute.default, (base, [0, 2, 1])) if flips.pop() else base
    # per-expert weights of different tensors: cat of unsqueezes, as decomposed graphs write stack
    return fake.call(graph, aten.cat.default, ([fake.call(graph, aten.unsqueeze.default, (w, 0)) for w in weights],))


def fused_halves(graph, fake, fused: torch.fx.Node, dim: int, gate_first: bool) -> tuple[torch.fx.Node, torch.fx.Node]:
    """The gate and up weights as views (slices along ``dim``) of the fused gate/up weight ``fused``."""
    f = shape_of(fused)[dim] // 2
    first = fake.call(graph, aten.slice.Tensor, (fused, dim, 0, f))
    second = fake.call(graph, aten.slice.Tensor, (fused, dim, f, 2 * f))
    return (first, second) if gate_first else (second, first)


class FakeNodes:
    """Creates nodes with ``meta['val']`` computed under the graph's fake mode."""

    def __init__(self, like: torch.fx.Node):
        from torch._guards import detect_fake_mode

        self.mode = detect_fake_mode([val(like)])

    def call(self, graph, target, args, kwargs=None) -> torch.fx.Node:
        node = graph.call_function(target, tuple(args), kwargs or {})

        def to_val(a):
            return val(a) if isinstance(a, torch.fx.Node) else a

        a = torch.fx.node.map_aggregate(node.args, to_val)
        k = torch.fx.node.map_aggregate(node.kwargs, to_val)
        with self.mode:
            node.meta["val"] = target(*a, **k)
        return node
