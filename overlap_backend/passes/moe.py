"""Pass ``moe``: dispatch all-to-all → SwiGLU expert GEMMs → combine all-to-all  ⇒  ``overlap.moe_experts``.

What an expert-parallel MoE layer looks like in a post-grad graph, in the three forms users write::

    R  = wait(all_to_all_single(x, recv_splits, send_splits, group))         # dispatch
    X  = <row moves of R>             view / permute / clone / cast, gather R[P], scatter into zeros
    G  = X @ Wg,  U = X @ Wu,  A = silu(G) * U,  D = A @ Wd                  # bmm | _grouped_mm | loop of mm
    Y  = <the inverse row moves of D>
    out = wait(all_to_all_single(Y, send_splits, recv_splits, group))      # combine: splits swapped

The row moves between R and the GEMMs are replayed on row ids (``arange(N)``) to give the op its
``rows`` index: grouped row ``j`` is received row ``rows[j]``. The moves after the GEMMs must undo
them: index moves pair up (a gather by ``P`` with a scatter by the same ``P`` node; a scatter by
``(e, slot)`` with a gather by the same nodes), and the static view/permute moves between them are
checked to compose to the identity by running them on concrete row ids. Whatever the index values
are, the op then computes exactly what the graph did (up to the documented cases where the graph's
own result is undefined: duplicate scatter indices, rows of an ``empty`` no index writes).

Values of the matched region that the rest of the graph still reads (what a training forward saves
for backward: the grouped input, G, U, A, and views of them) are taken from the op's ``saved``
outputs or recomputed from them by copying the cheap nodes in between; the down projection's output
and what follows it may not be read elsewhere.

Matching only looks (``find_moe``); ``check`` judges; ``rewrite`` replaces. Backward graphs hold
the same all-to-all pair around the experts' input gradients (``ExpertGrads``): in all three forms
they become one ``overlap.moe_experts_backward``, the weight gradients staying in the graph.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch._inductor.pattern_matcher import MULTIPLE, CallFunction, KeywordArg
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.experimental.symbolic_shapes import statically_known_true

from . import common
from .common import RESHAPES, Rejected, arg, val
from .manager import OverlapPass

aten = torch.ops.aten
prims = torch.ops.prims
c10d = torch.ops._c10d_functional

GEMMS = (aten.bmm.default, aten._grouped_mm.default, aten.mm.default)
CASTS = (prims.convert_element_type.default,)
FILLS = (aten.full.default, aten.zeros.default, aten.empty.memory_format, aten.new_zeros.default, aten.new_empty.default)
SAVED = ("recv", "xg", "gate", "up", "act")  # = runtime.ops.MOE_SAVED (the runtime is not imported here)

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


class _NoMatch(Exception):
    """The structure is not the MoE block; the message says where it differs."""


# ------------------------------------------------------------------------------ the match
@dataclass
class AllToAll:
    collective: torch.fx.Node
    wait: torch.fx.Node
    input: torch.fx.Node
    output_splits: list
    input_splits: list
    group_name: str


@dataclass
class Step:
    """One row move: ``kind`` in view | permute | clone | cast | gather | scatter."""

    node: torch.fx.Node
    kind: str
    src: torch.fx.Node  # the moved tensor
    index: list | None = None  # gather/scatter index nodes
    base: torch.fx.Node | None = None  # scatter: the tensor written into


@dataclass
class Experts:
    form: str  # "bmm" | "grouped_mm" | "loop"
    grouped: torch.fx.Node  # the grouped rows: GEMM input (bmm, grouped_mm) or the tensor the loop splits
    gate: list[torch.fx.Node]  # per GEMM group: one node, or one per expert (loop)
    up: list[torch.fx.Node]
    act: list[torch.fx.Node]
    down: list[torch.fx.Node]
    w_gate: list[torch.fx.Node]
    w_up: list[torch.fx.Node]
    w_down: list[torch.fx.Node]
    down_out: torch.fx.Node  # the experts' output, rows in grouped order (D, or the loop's cat)
    offsets: torch.fx.Node | None = None  # grouped_mm offs
    group_sizes: list | None = None  # rows per expert (bmm, loop)
    inner: list[torch.fx.Node] = field(default_factory=list)  # silu / cast / piece nodes in between
    pieces: list[torch.fx.Node] = field(default_factory=list)  # loop: each expert's input rows
    split: torch.fx.Node | None = None  # loop: the split node the pieces come from


@dataclass
class ExpertGrads:
    """A backward graph's expert input gradients between its two all-to-alls, per expert group (one
    group for ``bmm`` / ``_grouped_mm``, one per expert for the loop form)::

        dA = dY @ Wd^T,  dU = dA * silu(G),  dG = silu'(G) * (dA * U),  dX = dG @ Wg^T + dU @ Wu^T

    (the pointwise part in whatever decomposed form the graph holds, checked by evaluating it)."""

    form: str  # "bmm" | "grouped_mm" | "loop"
    dy: torch.fx.Node  # the grouped result gradients (loop: the tensor the experts' pieces are taken from)
    d_act: list[torch.fx.Node]  # dA = kind(dY, wt_down)
    d_gate: list[torch.fx.Node]  # dG: the input of the GEMM with wt_gate
    d_up: list[torch.fx.Node]  # dU: the input of the GEMM with wt_up
    gate: list[torch.fx.Node]  # G, U of the forward (saved values)
    up: list[torch.fx.Node]
    wt_gate: list[torch.fx.Node]  # the transposed weights the GEMMs read: [E, F, H], [E, F, H], [E, H, F] (loop: per expert)
    wt_up: list[torch.fx.Node]
    wt_down: list[torch.fx.Node]
    dx_out: torch.fx.Node  # dX (loop: its assembly: a cat, or a sum of select_scatters)
    gemms: list[torch.fx.Node]  # the GEMMs
    inner: list[torch.fx.Node]  # the pointwise nodes between dA and dG, dU
    offsets: torch.fx.Node | None = None  # grouped_mm offs
    group_sizes: list | None = None  # rows per expert (bmm, loop)
    pieces: list[torch.fx.Node] = field(default_factory=list)  # loop: each expert's dY rows (select / slice of dy)
    bounds: list = field(default_factory=list)  # loop over slices: (start, end) of each piece
    joins: list[torch.fx.Node] = field(default_factory=list)  # loop: the nodes assembling dX


@dataclass
class MoeMatch:
    combine: AllToAll
    dispatch: AllToAll | None = None
    experts: Experts | None = None  # forward: the SwiGLU experts
    grads: ExpertGrads | None = None  # backward: their input gradients
    in_steps: list[Step] = field(default_factory=list)  # R → grouped
    out_steps: list[Step] = field(default_factory=list)  # grouped (down_out / dx_out) → combine input
    failure: str | None = None
    comm_sms: int = -1  # the op's comm_sms (set by check: the cost model's pick, -1 = the setting)

    @property
    def out_node(self) -> torch.fx.Node:
        """The grouped rows the out-steps move back: the experts' output (forward) or dX (backward)."""
        return self.experts.down_out if self.experts is not None else self.grads.dx_out


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
        if n.target in GEMMS or n.target is aten.addmm.default:  # (addmm: Inductor's fold of mm + mm)
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
        if n.target in GEMMS or n.target in (aten.cat.default, aten.stack.default):
            return list(reversed(steps)), n
        if accumulate_ok and n.target is aten.add.Tensor:
            return list(reversed(steps)), n
        if n.target is aten.index_put.default and arg(n, 3, "accumulate", False) and not accumulate_ok:
            raise _NoMatch(f"the combined rows are scattered with accumulate=True ({n.name})")
        step = _row_step(n, scatter_accumulate_ok=accumulate_ok)
        if step is None:
            raise _NoMatch(f"the combined tensor is computed by {_what(n)}, not moved rows of expert GEMMs")
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
            raise _NoMatch(f"the experts' input is computed by {_what(n)}, not moved rows of an all_to_all_single")
        steps.append(step)
        n = step.src
    return list(reversed(steps)), n


def _what(n: Any) -> str:
    if not isinstance(n, torch.fx.Node):
        return repr(n)
    return f"{getattr(n.target, '__name__', n.target)} ({n.name})" if n.op == "call_function" else f"{n.op} {n.name}"


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


def _gemm(n: Any, kind) -> tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node | None]:
    """``n = kind(a, b[, offs])``: ``(a, b, offs)``."""
    if not (isinstance(n, torch.fx.Node) and n.target is kind):
        raise _NoMatch(f"expected a {kind.__name__} where {_what(n)} is")
    a, b = n.args[0], n.args[1]
    offs = arg(n, 2, "offs") if kind is aten._grouped_mm.default else None
    if kind is aten._grouped_mm.default and (arg(n, 3, "bias") is not None or arg(n, 4, "out_dtype") is not None):
        raise _NoMatch(f"{n.name}: grouped GEMM with a bias or an out_dtype")
    return a, b, offs


def _swiglu(down: torch.fx.Node, kind):
    """``down = kind(silu(gate) * up, w_down)`` with gate/up ``kind(x, w)`` of one ``x``."""
    act, w_down, offs = _gemm(down, kind)
    if not (isinstance(act, torch.fx.Node) and act.target is aten.mul.Tensor):
        raise _NoMatch(f"the down projection {down.name} does not read silu(gate) * up but {_what(act)}")
    for s, u in ((act.args[0], act.args[1]), (act.args[1], act.args[0])):
        if isinstance(s, torch.fx.Node) and (silu := _silu_of(s)) is not None:
            gate, silu_nodes = silu
            break
    else:
        raise _NoMatch(f"{act.name} is not silu(gate) * up")
    x, w_gate, offs_g = _gemm(gate, kind)
    x_u, w_up, offs_u = _gemm(u, kind)
    if x_u is not x:
        raise _NoMatch(f"gate {gate.name} and up {u.name} projections read different inputs")
    if kind is aten._grouped_mm.default and not (offs is offs_g is offs_u and isinstance(offs, torch.fx.Node)):
        raise _NoMatch("the three grouped GEMMs do not share one offs tensor")
    return dict(x=x, gate=gate, up=u, act=act, w_gate=w_gate, w_up=w_up, w_down=w_down, offs=offs, inner=silu_nodes)


def _piece(x: torch.fx.Node) -> tuple[torch.fx.Node, Any, list[torch.fx.Node], Any]:
    """A loop expert's input rows: ``(base, index, nodes, split)`` for ``select(base, 0, i)`` or
    ``getitem(split(base, sizes), i)`` (after an optional cast)."""
    n, casts = _strip_cast(x)
    if isinstance(n, torch.fx.Node) and n.target is aten.select.int and arg(n, 1, "dim") == 0:
        return n.args[0], arg(n, 2, "index"), casts + [n], None
    if isinstance(n, torch.fx.Node) and n.target is operator.getitem:
        split = n.args[0]
        if isinstance(split, torch.fx.Node) and split.target in common.SPLITS and arg(split, 2, "dim", 0) == 0:
            return split.args[0], n.args[1], casts + [n], split
    raise _NoMatch(f"a loop expert's input {_what(x)} is not a select or split piece of one tensor")


def _match_experts(d: torch.fx.Node) -> Experts:
    if d.target in (aten.bmm.default, aten._grouped_mm.default):
        form = "bmm" if d.target is aten.bmm.default else "grouped_mm"
        s = _swiglu(d, d.target)
        sizes = None
        if form == "bmm":
            shape = val(s["x"]).shape
            sizes = [shape[1]] * shape[0]
        return Experts(
            form=form, grouped=s["x"], gate=[s["gate"]], up=[s["up"]], act=[s["act"]], down=[d],
            w_gate=[s["w_gate"]], w_up=[s["w_up"]], w_down=[s["w_down"]], down_out=d,
            offsets=s["offs"], group_sizes=sizes, inner=s["inner"],
        )
    if d.target is aten.mm.default:
        raise _NoMatch(f"a single mm ({d.name}) produces the combined rows, not a group of experts")
    # loop: cat/stack of one SwiGLU of mm per expert
    if arg(d, 1, "dim", 0) != 0:
        raise _NoMatch(f"the experts' outputs are concatenated along dim {arg(d, 1, 'dim', 0)}, not 0")
    outs = list(d.args[0])
    per = [_swiglu(o, aten.mm.default) for o in outs]
    pieces = [_piece(p["x"]) for p in per]
    base, split = pieces[0][0], pieces[0][3]
    for i, (b, idx, _, sp) in enumerate(pieces):
        if b is not base or sp is not split:
            raise _NoMatch("the loop's experts read pieces of different tensors")
        if idx != i:
            raise _NoMatch(f"the loop's expert {i} reads piece {idx}: pieces out of order")
    bshape = val(base).shape
    if split is None:
        if len(bshape) != 3 or not _eq(bshape[0], len(per)):
            raise _NoMatch(f"the loop selects {len(per)} experts from a tensor of shape {tuple(bshape)}")
        sizes = [bshape[1]] * len(per)
    elif split.target is aten.split.Tensor:
        size = split.args[1]
        if not isinstance(size, int) or not _eq(bshape[0], size * len(per)):
            raise _NoMatch(f"the loop splits {tuple(bshape)} into chunks of {size}, not {len(per)} equal pieces")
        sizes = [size] * len(per)
    else:
        sizes = list(split.args[1])
        if len(sizes) != len(per):
            raise _NoMatch(f"the loop runs {len(per)} experts on {len(sizes)} pieces")
    if d.target is aten.stack.default and split is not None:
        raise _NoMatch("the loop stacks experts of different row counts")
    inner = [n for p, pc in zip(per, pieces) for n in p["inner"] + pc[2]] + ([split] if split is not None else [])
    return Experts(
        form="loop", grouped=base, gate=[p["gate"] for p in per], up=[p["up"] for p in per],
        act=[p["act"] for p in per], down=outs, w_gate=[p["w_gate"] for p in per],
        w_up=[p["w_up"] for p in per], w_down=[p["w_down"] for p in per], down_out=d,
        group_sizes=sizes, inner=inner, pieces=[p["x"] for p in per], split=split,
    )


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


def _one_expert_grads(dx: torch.fx.Node, kinds) -> dict:
    """``dx = dG @ Wg^T + dU @ Wu^T`` (one GEMM kind from ``kinds``) with ``dG``, ``dU`` the SwiGLU
    gradients of ``dA = dY @ Wd^T``. For ``mm`` the sum may be one ``addmm(mm(...), ·, ·)``: Inductor's
    post-grad patterns fold ``mm + mm`` so before the pass runs."""
    if _plain_addmm(dx) and aten.mm.default in kinds:
        c, a, b = dx.args[:3]
        if not (isinstance(c, torch.fx.Node) and c.target is aten.mm.default):
            raise _NoMatch(f"{dx.name} adds {_what(c)} to an expert GEMM, not another expert GEMM")
        kind = aten.mm.default
        terms = [(c, *_gemm(c, kind)), (dx, a, b, None)]
    else:
        if not _plain_add(dx):
            raise _NoMatch(f"an expert's input gradient is {_what(dx)}, not the sum of two GEMMs")
        a, b = dx.args[0], dx.args[1]
        if not all(isinstance(x, torch.fx.Node) and x.target in kinds for x in (a, b)) or a.target is not b.target:
            raise _NoMatch(f"{dx.name} does not add two expert GEMMs ({_what(a)}, {_what(b)})")
        kind = a.target
        terms = [(gemm, *_gemm(gemm, kind)) for gemm in (a, b)]
    branches = []
    for gemm, lhs, w, offs in terms:
        cone, leaves = _pointwise_cone(lhs)
        branches.append((gemm, lhs, w, offs, cone, leaves))
    # dU's cone reads dA and G; dG's reads dA, U and G
    branches.sort(key=lambda br: len(br[5]))
    (g_up, d_up, wt_up, offs_u, cone_u, leaves_u), (g_gate, d_gate, wt_gate, offs_g, cone_g, leaves_g) = branches
    d_act = next((n for n in leaves_u if n in leaves_g and isinstance(n, torch.fx.Node) and n.target is kind), None)
    if d_act is None or len(leaves_u) != 2 or len(leaves_g) != 3:
        raise _NoMatch(f"the gradients {d_up.name}, {d_gate.name} of the two expert GEMMs are not computed from one "
                       "gradient GEMM and the saved gate and up")
    gate = next(n for n in leaves_u if n is not d_act)
    others = [n for n in leaves_g if n is not d_act and n is not gate]
    if len(others) != 1:
        raise _NoMatch(f"{d_gate.name} does not read the gate {gate.name} that {d_up.name} reads")
    (up,) = others
    if not _computes(d_up, {"da": d_act, "g": gate}, lambda da, g: da * g * torch.sigmoid(g)):
        raise _NoMatch(f"{d_up.name} is not dA * silu(gate) ({d_act.name}, {gate.name})")
    if not _computes(d_gate, {"da": d_act, "g": gate, "u": up}, lambda da, g, u: da * u * _silu_grad(g)):
        raise _NoMatch(f"{d_gate.name} is not silu'(gate) * dA * up ({d_act.name}, {gate.name}, {up.name})")
    dy, wt_down, offs_d = _gemm(d_act, kind)
    if kind is aten._grouped_mm.default and not (offs_d is offs_u is offs_g and isinstance(offs_d, torch.fx.Node)):
        raise _NoMatch("the three grouped gradient GEMMs do not share one offs tensor")
    return dict(kind=kind, dy=dy, d_act=d_act, d_gate=d_gate, d_up=d_up, gate=gate, up=up, wt_gate=wt_gate,
                wt_up=wt_up, wt_down=wt_down, gemms=[d_act, g_gate, g_up], inner=list(dict.fromkeys(cone_u + cone_g)),
                offs=offs_d)


def _plain_addmm(n: Any) -> bool:
    """``n = c + a @ b`` (``aten.addmm`` with ``beta`` and ``alpha`` 1)."""
    return (isinstance(n, torch.fx.Node) and n.target is aten.addmm.default and arg(n, 3, "beta", 1) == 1
            and arg(n, 4, "alpha", 1) == 1)


def _plain_add(n: Any) -> bool:
    """``n = a + b`` (``aten.add.Tensor`` without a scaling ``alpha``)."""
    return isinstance(n, torch.fx.Node) and n.target is aten.add.Tensor and arg(n, 2, "alpha", 1) == 1


def _is_zeros(n: Any) -> bool:
    return isinstance(n, torch.fx.Node) and n.target in (aten.full.default, aten.zeros.default) and _zero_fill(n)


def _loop_terms(out: torch.fx.Node) -> tuple[list[torch.fx.Node], list[torch.fx.Node]]:
    """The loop form's per-expert input gradients, in expert order, and the nodes that assemble them:
    ``cat([dX_0, dX_1, ...])``, or a sum of ``select_scatter(zeros, dX_e, 0, e)``."""
    if out.target is aten.cat.default:
        if arg(out, 1, "dim", 0) != 0:
            raise _NoMatch(f"the experts' input gradients are concatenated along dim {arg(out, 1, 'dim', 0)}")
        return list(out.args[0]), [out]
    terms, joins, stack = {}, [], [out]
    while stack:
        n = stack.pop()
        if not isinstance(n, torch.fx.Node):
            raise _NoMatch(f"the input gradients add {n!r}")
        if _plain_add(n) and all(isinstance(x, torch.fx.Node) and x.target in (
                aten.add.Tensor, aten.select_scatter.default) for x in n.args[:2]):
            joins.append(n)
            stack.extend(n.args[:2])
        elif n.target is aten.select_scatter.default and arg(n, 2, "dim") == 0 and _is_zeros(n.args[0]):
            e = arg(n, 3, "index")
            if not isinstance(e, int) or e in terms:
                raise _NoMatch(f"{n.name} places an expert's input gradient at {e!r} twice or at a symbolic index")
            joins.append(n)
            terms[e] = n.args[1]
        else:
            raise _NoMatch(f"the experts' input gradients are assembled by {_what(n)}, not select_scatter / add / cat")
    if sorted(terms) != list(range(len(terms))):
        raise _NoMatch(f"the loop's input gradients are placed at experts {sorted(terms)}")
    return [terms[e] for e in range(len(terms))], joins


def _grad_pieces(pieces: list) -> tuple[torch.fx.Node, list, list]:
    """The loop's per-expert dY rows: ``select(dY, 0, e)`` or consecutive ``slice(dY, 0, start, end)``
    of one tensor, in expert order: ``(dY, group sizes, slice bounds)``."""
    base = pieces[0].args[0] if isinstance(pieces[0], torch.fx.Node) else None
    if all(isinstance(p, torch.fx.Node) and p.target is aten.select.int and p.args[0] is base
           and arg(p, 1, "dim") == 0 and arg(p, 2, "index") == e for e, p in enumerate(pieces)):
        shape = _shape(base)
        if len(shape) != 3 or not _eq(shape[0], len(pieces)):
            raise _NoMatch(f"the loop selects {len(pieces)} experts' gradients from a tensor of shape {shape}")
        return base, [shape[1]] * len(pieces), []
    bounds = []
    for e, p in enumerate(pieces):
        if not (isinstance(p, torch.fx.Node) and p.target is aten.slice.Tensor and p.args[0] is base
                and arg(p, 1, "dim", 0) == 0 and arg(p, 4, "step", 1) == 1):
            raise _NoMatch(f"expert {e}'s result gradient {_what(p)} is not a select or slice of one tensor")
        start, end = arg(p, 2, "start", 0), arg(p, 3, "end")
        size = (lambda x: val(x) if isinstance(x, torch.fx.Node) else x)  # noqa: E731
        if (e == 0 and not _eq(size(start), 0)) or (e > 0 and start is not bounds[-1][1]
                                                    and not _eq(size(start), size(bounds[-1][1]))):
            raise _NoMatch(f"the loop's gradient slices are not consecutive ({p.name} starts at {start!r})")
        bounds.append((start, end))
    return base, [None] * len(pieces), bounds


def _match_expert_grads(out: torch.fx.Node) -> ExpertGrads:
    """The experts' input gradients ``out`` of a backward graph, in any of the three forms."""
    if _plain_add(out) and all(isinstance(x, torch.fx.Node) and x.target in (
            aten.bmm.default, aten._grouped_mm.default) for x in out.args[:2]):
        g = _one_expert_grads(out, (aten.bmm.default, aten._grouped_mm.default))
        form = "bmm" if g["kind"] is aten.bmm.default else "grouped_mm"
        sizes = None
        if form == "bmm":
            shape = val(g["dy"]).shape
            sizes = [shape[1]] * shape[0]
        return ExpertGrads(
            form=form, dy=g["dy"], d_act=[g["d_act"]], d_gate=[g["d_gate"]], d_up=[g["d_up"]], gate=[g["gate"]],
            up=[g["up"]], wt_gate=[g["wt_gate"]], wt_up=[g["wt_up"]], wt_down=[g["wt_down"]], dx_out=out,
            gemms=g["gemms"], inner=g["inner"], offsets=g["offs"] if form == "grouped_mm" else None, group_sizes=sizes,
        )
    terms, joins = _loop_terms(out)
    per = [_one_expert_grads(t, (aten.mm.default,)) for t in terms]
    dy, sizes, bounds = _grad_pieces([p["dy"] for p in per])
    return ExpertGrads(
        form="loop", dy=dy, d_act=[p["d_act"] for p in per], d_gate=[p["d_gate"] for p in per],
        d_up=[p["d_up"] for p in per], gate=[p["gate"] for p in per], up=[p["up"] for p in per],
        wt_gate=[p["wt_gate"] for p in per], wt_up=[p["wt_up"] for p in per], wt_down=[p["wt_down"] for p in per],
        dx_out=out, gemms=[n for p in per for n in p["gemms"]], inner=[n for p in per for n in p["inner"]] + terms,
        group_sizes=sizes, pieces=[p["dy"] for p in per], bounds=bounds, joins=joins,
    )


def _grads_out(out: torch.fx.Node) -> bool:
    """Is ``out`` (where the walk from a combine input stopped) a backward's experts' input gradients:
    an ``add`` (of GEMMs, or of placed per-expert gradients) or a ``cat`` of per-expert sums (``add``,
    or ``addmm`` where Inductor folded ``mm + mm``)?"""
    if out.target is aten.add.Tensor:
        return True
    return out.target is aten.cat.default and all(
        isinstance(t, torch.fx.Node) and t.target in (aten.add.Tensor, aten.addmm.default) for t in out.args[0])


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
            if _grads_out(out):  # a backward graph: the experts' input gradients
                try:
                    m.grads = _match_expert_grads(out)
                except _NoMatch as e:  # (a forward graph's add, e.g. a shared expert's output, lands here too)
                    raise _NoMatch(f"the combined tensor is computed by {_what(out)}: neither moved rows of expert "
                                   f"GEMMs nor the experts' input gradients ({e})") from None
                grouped = m.grads.dy
            else:
                for st in m.out_steps:
                    if st.kind == "scatter" and arg(st.node, 3, "accumulate", False):
                        raise _NoMatch(f"the combined rows are scattered with accumulate=True ({st.node.name}) from "
                                       f"{_what(out)}: gradients, but not the experts' dX = dG @ Wg^T + dU @ Wu^T")
                m.experts = _match_experts(out)
                grouped = m.experts.grouped
            m.in_steps, recv = _walk_in(grouped, accumulate_ok=m.grads is not None)
            m.dispatch = by_wait[recv]
        except _NoMatch as e:
            m.failure = str(e)
        matches.append(m)
    return matches


# --------------------------------------------------------------------- layout checks
def _shape(n: torch.fx.Node) -> tuple:
    return tuple(val(n).shape)


def _static(shape) -> bool:
    return all(isinstance(s, int) for s in shape)


def _eq(a, b) -> bool:
    """``a == b`` for sizes that may be SymInts, without guarding (unknown counts as unequal)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return statically_known_true(a == b)


def _shape_eq(a, b) -> bool:
    return len(a) == len(b) and all(_eq(x, y) for x, y in zip(a, b))


def _keeps_rows(step: Step) -> str | None:
    """Why ``step`` does not move whole rows (the last dim stays the row's width), or None."""
    src, out = _shape(step.src), _shape(step.node)
    if step.kind in ("view",):
        if not src or not out or not _eq(src[-1], out[-1]):
            return f"{step.node.name} reshapes {src} -> {out}: the row width changes"
    elif step.kind == "permute":
        dims = list(step.node.args[1])
        if dims[-1] % len(dims) != len(dims) - 1:
            return f"{step.node.name} permutes the row width away from the last dim"
    elif step.kind in ("gather", "scatter"):
        index = step.index
        if not index or any(not isinstance(i, torch.fx.Node) for i in index):
            return f"{step.node.name} indexes with {index} (only index tensors on the leading dims are understood)"
        ishapes = [_shape(i) for i in index]
        if any(len(sh) != 1 or not _shape_eq(sh, ishapes[0]) for sh in ishapes):
            return f"{step.node.name} indexes with tensors of shapes {ishapes} (only equal 1-D ones)"
        moved = step.base if step.kind == "scatter" else step.src
        if len(index) >= len(_shape(moved)):
            return f"{step.node.name} indexes into the row width"
        if step.kind == "scatter" and step.base.target not in FILLS:
            return f"{step.node.name} scatters into {_what(step.base)}, not a fresh tensor"
    return None


def _replay(steps: list[Step], ids: torch.Tensor) -> torch.Tensor:
    """Run static view/permute/clone/cast steps on concrete row ids (last dim 1)."""
    for s in steps:
        if s.kind == "view":
            ids = ids.reshape(list(_shape(s.node)[:-1]) + [1])
        elif s.kind == "permute":
            ids = ids.permute(list(s.node.args[1]))
    return ids


def _segments(steps: list[Step]) -> tuple[list[list[Step]], list[Step]]:
    segs, idx, cur = [], [], []
    for s in steps:
        if s.kind in ("gather", "scatter"):
            segs.append(cur)
            idx.append(s)
            cur = []
        elif s.kind != "cast":
            cur.append(s)
    segs.append(cur)
    return segs, idx


def _noop(s: Step) -> bool:
    if s.kind == "clone":
        return True
    if s.kind == "permute":
        return list(s.node.args[1]) == list(range(len(s.node.args[1])))
    return _shape_eq(_shape(s.src), _shape(s.node))


def layout_error(m: MoeMatch) -> str | None:
    """Why the moves after the experts do not undo the moves before them, or None."""
    for s in m.in_steps + m.out_steps:
        if err := _keeps_rows(s):
            return err
        if s.kind == "scatter" and s in m.in_steps and not _zero_fill(s.base):
            return f"{s.node.name}: the padded expert input is not zero-filled"
    in_segs, in_idx = _segments(m.in_steps)
    out_segs, out_idx = _segments(m.out_steps)
    if len(in_idx) != len(out_idx):
        return f"{len(in_idx)} index moves before the experts but {len(out_idx)} after them"
    k = len(in_idx)
    for i, a in enumerate(in_idx):
        b = out_idx[k - 1 - i]
        if {a.kind, b.kind} != {"gather", "scatter"} or len(a.index) != len(b.index) or any(
            x is not y for x, y in zip(a.index, b.index)
        ):
            return f"{b.node.name} does not undo {a.node.name} (a gather and a scatter by the same index nodes)"
    # Segment i before the experts is undone by segment k - i after them.
    entering = [m.dispatch.wait] + [s.node for s in in_idx]
    for i in range(k + 1):
        seg_in, seg_out = in_segs[i], out_segs[k - i]
        start = _shape(entering[i])
        shapes = [start] + [_shape(s.node) for s in seg_in + seg_out]
        if not all(_static(sh) for sh in shapes):
            if not all(_noop(s) for s in seg_in + seg_out):
                return "row moves with symbolic shapes between the index moves (only no-op views are understood)"
            continue
        with unset_fake_temporarily():  # concrete ids, also when called under the graph's fake mode
            err = _segment_error(m, i, k, start, seg_in, seg_out, out_idx)
        if err:
            return err
    return None


def _segment_error(m, i, k, start, seg_in, seg_out, out_idx) -> str | None:
    """Does segment ``i`` before the experts, then segment ``k - i`` after them, give back the rows
    that entered it? (Between them, the inner index moves and the experts keep each row in place.)"""
    ids = torch.arange(math.prod(start[:-1])).reshape(list(start[:-1]) + [1])
    moved = _replay(seg_in, ids)
    # where segment k - i starts: the experts' output, or the index move that undoes in_idx[i]
    resume = m.out_node if i == k else out_idx[k - 1 - i].node
    resume_shape = list(_shape(resume)[:-1])
    if moved.numel() != math.prod(resume_shape):
        return f"{resume.name} holds {math.prod(resume_shape)} rows where {moved.numel()} went in"
    back = _replay(seg_out, moved.reshape(resume_shape + [1]))
    if tuple(back.shape) != tuple(ids.shape) or not torch.equal(back, ids):
        names = [s.node.name for s in seg_in + seg_out]
        return f"the row moves {names} after the experts do not undo those before them"
    return None


def _zero_fill(base: torch.fx.Node) -> bool:
    if base.target is aten.zeros.default:
        return True
    return base.target is aten.full.default and base.args[1] == 0


# ------------------------------------------------------------------------------ the pass
@dataclass
class _Region:
    nodes: set  # every node between the dispatch and the combine, both included
    dying: set  # region nodes plus what only they use (fills, sym_size)
    outside: dict  # region node -> its users outside ``dying``
    known: set  # nodes the structural match accounts for


class MoePass(OverlapPass):
    name = "moe"

    def find(self, graph):
        return find_moe(graph)

    def key(self, m: MoeMatch):
        return m.combine.collective

    def describe(self, m: MoeMatch):
        nodes = []
        if m.dispatch is not None:
            nodes += [m.dispatch.collective, m.dispatch.wait]
        if m.experts is not None:
            e = m.experts
            nodes += [n for group in (e.gate, e.up, e.down) for n in group]
        if m.grads is not None:
            nodes += m.grads.gemms
        nodes += [m.combine.collective, m.combine.wait]
        return [n.name for n in nodes]

    # ---------------------------------------------------------------------------- check
    def check(self, m: MoeMatch) -> str:
        if m.failure is not None:
            raise Rejected(self._reason(m.failure))
        d, c, e = m.dispatch, m.combine, m.experts
        if d.group_name != c.group_name:
            raise Rejected(f"dispatch and combine run on different groups {d.group_name!r}, {c.group_name!r}")
        ws = common.require_group(c.group_name)
        for name, splits in (("dispatch", d.output_splits), ("dispatch", d.input_splits)):
            if len(splits) != ws:
                raise Rejected(f"the {name} has {len(splits)} splits for a group of {ws} ranks")
        if not (_same(c.output_splits, d.input_splits) and _same(c.input_splits, d.output_splits)):
            raise Rejected("the combine's split sizes are not the dispatch's, swapped")
        if m.grads is not None:
            return self._check_grads(m, ws)
        self._check_dtypes(m)
        self._check_weights(m)
        # raises Rejected for values read outside that cannot be provided
        need = self._check_region(m, self._plan_outside, self._op_inputs(m), "the expert block", "dispatched rows")
        from ..spec import knobs

        wg = _shape(e.w_gate[0])
        experts = len(e.w_gate) if e.form == "loop" else wg[0]
        # symm runs as p2p where its kernels are off (knobs.moe.ENABLED) and where the op hands out saved values
        lowering, decision = self._decide(m, ws, "moe_experts", e.grouped, wg[-1], experts, val(e.gate[0]).dtype,
                                          knobs.moe.ENABLED and not need, self.ctx.config.moe_comm_sms)
        m.comm_sms = decision.comm_sms  # the model's pick where the setting is auto
        if m.comm_sms < 0 and isinstance(self.ctx.config.moe_comm_sms, int):
            # the backend's setting, fixed when the graph is compiled as cta_stages is (else the op would read
            # OVERLAP_MOE_COMM_SMS per call and silently ignore make_backend(moe_comm_sms=...))
            m.comm_sms = self.ctx.config.moe_comm_sms
        return common.written_lowering(self.ctx, lowering, decision)

    def _check_region(self, m: MoeMatch, outside, inputs: list, what: str, received: str):
        """The checks both directions share: the row moves undo each other, nothing else is computed
        between the all-to-alls, values read outside can be provided (``outside(m, region)``, whose
        result is returned), the op's inputs do not depend on what the first all-to-all received, and
        the output's size."""
        if err := layout_error(m):
            raise Rejected(err)
        region = self._region(m)
        extra = region.nodes - region.known
        if extra:
            raise Rejected(f"the region between the all-to-alls also computes {sorted(n.name for n in extra)}")
        provided = outside(m, region)
        for n in inputs:
            if n in region.nodes or m.dispatch.wait in common.ancestors(n):
                raise Rejected(f"{n.name} (an input of {what}) depends on the {received}")
        out = _shape(m.out_node)
        if _static(out):
            common.require_min_numel(self.ctx, math.prod(out))
        return provided

    def _decide(self, m: MoeMatch, ws: int, op: str, grouped: torch.fx.Node, f, experts, cd, symm_runs: bool,
                comm_sms):
        """``(lowering, the cost model's decision)``: ``op``'s lowering (``p2p`` where the chosen one does not
        implement it), priced as the forward ``moe_experts`` problem of these shapes (the backward op does
        the same three GEMMs per grouped row and moves the same all-to-all bytes)."""
        d, c = m.dispatch, m.combine
        from ..runtime import available
        from . import cost_model

        lowering = common.choose_lowering(self.ctx, c.group_name, common.device_type(d.input))
        lowering = lowering if lowering in available(op) else "p2p"
        nodes = (d.input, d.wait, grouped, c.input)
        if self.ctx.captured(nodes) and (lowering == "p2p" or not symm_runs):
            # the p2p lowering reads the per-expert counts on the host: a CUDA-graph capture cannot
            raise Rejected(f"the graph is replayed from a CUDA graph and {op} would run on p2p, which reads the "
                           "per-expert row counts on the host (a synchronisation a capture cannot hold): the "
                           "all-to-alls are left to NCCL")
        hint = common.hint
        gshape = _shape(grouped)
        problem = cost_model.Problem(
            "moe_experts", m=math.prod(hint(x) for x in gshape[:-1]), k=hint(gshape[-1]), n=hint(gshape[-1]),
            f=hint(f), experts=hint(experts), rows_sent=hint(_shape(d.input)[0]), dtype=str(cd).removeprefix("torch."),
            ws=ws,
        )
        decision = self.price(problem, c.group_name, common.device_type(d.input),
                              common.lowering_candidates(self.ctx, lowering, symm_runs), nodes=nodes,
                              comm_sms=comm_sms)
        return lowering, decision

    def _reason(self, why: str) -> str:
        if self.ctx.graph_kind == "backward":
            return f"backward graph: {why}"
        return why

    # ------------------------------------------------------------------ backward graphs
    def _check_grads(self, m: MoeMatch, ws: int) -> str:
        """The expert gradients between a backward graph's all-to-alls: ``moe_experts_backward``."""
        d, c, g = m.dispatch, m.combine, m.grads
        cd = val(g.d_act[0]).dtype
        common.require_dtype(g.dy, *g.d_gate, *g.d_up, *g.gate, *g.up, *g.wt_gate, *g.wt_up, *g.wt_down, *g.gemms,
                             *g.pieces)
        _check_row_dtypes(m, cd, "the input gradient", "gradients")
        h = _shape(d.wait)[-1]
        if g.form == "loop":
            shapes = {(_shape(a), _shape(b), _shape(w)) for a, b, w in zip(g.wt_gate, g.wt_up, g.wt_down)}
            if len(shapes) != 1:
                raise Rejected(f"the loop's experts have weights of different shapes {sorted(shapes)}")
            wg, wu, wd = ((len(g.wt_gate), *x) for x in next(iter(shapes)))
        else:
            wg, wu, wd = _shape(g.wt_gate[0]), _shape(g.wt_up[0]), _shape(g.wt_down[0])
        if len(wg) != 3 or not _shape_eq(wg, wu) or not _shape_eq(wd, (wg[0], wg[2], wg[1])) or not _eq(wg[2], h):
            raise Rejected(f"expert weights (transposed) {wg}, {wu}, {wd} are not [E, F, {h}], [E, F, {h}], [E, {h}, F]")
        for i, (gt, ut) in enumerate(zip(g.gate, g.up)):
            rows = _shape(g.pieces[i] if g.form == "loop" else g.dy)[:-1]
            gshape, ushape = _shape(gt), _shape(ut)
            if not _shape_eq(gshape, ushape) or not _shape_eq(gshape[:-1], rows) or not _eq(gshape[-1], wg[1]):
                raise Rejected(f"the saved gate {gshape} and up {ushape} are not a row of F={wg[1]} per grouped row "
                               f"{rows}")
        if g.form == "grouped_mm" and not _shape_eq(_shape(g.offsets), (wg[0],)):
            raise Rejected(f"grouped GEMM offs of shape {_shape(g.offsets)} for {wg[0]} experts")
        if g.form == "bmm" and not _eq(_shape(g.dy)[0], wg[0]):
            raise Rejected(f"bmm over {_shape(g.dy)[0]} groups but {wg[0]} experts")
        self._check_region(m, self._outside_grads, self._grad_inputs(m), "the expert gradients",
                           "received gradients")
        # no symm kernels for the gradients: p2p wherever the forward could run symm
        lowering, decision = self._decide(m, ws, "moe_experts_backward", g.dy, wg[1], wg[0], cd, False, 0)
        return common.written_lowering(self.ctx, lowering, decision)

    def _outside_grads(self, m: MoeMatch, region: _Region) -> dict:
        """Region value -> (op output, expert or None) it is read as outside the region: dY, dG, dU (what
        the weight gradients read; the loop form's per expert); :class:`Rejected` for any other value."""
        g, d, c = m.grads, m.dispatch, m.combine
        if g.form == "loop":
            provided = {n: (i, e) for i, group in ((1, g.pieces), (2, g.d_gate), (3, g.d_up)) for e, n in enumerate(group)}
        else:
            provided = {g.dy: (1, None), g.d_gate[0]: (2, None), g.d_up[0]: (3, None)}
        for n, users in region.outside.items():
            if n is c.wait or n in provided:
                continue
            if n in (d.collective, c.collective):
                _only_row_counts(n, users)
                continue
            raise Rejected(f"{n.name} (between the all-to-alls) is also read outside by {[u.name for u in users]}")
        return provided

    def _grad_inputs(self, m: MoeMatch) -> list[torch.fx.Node]:
        g = m.grads
        nodes = [m.dispatch.input] + list(m.dispatch.output_splits) + list(m.dispatch.input_splits)
        nodes += [i for s in m.in_steps for i in (s.index or [])]
        nodes += [s.base for s in m.in_steps if s.base is not None]
        nodes += g.gate + g.up + g.wt_gate + g.wt_up + g.wt_down + ([g.offsets] if g.offsets is not None else [])
        nodes += list(g.group_sizes or []) + [b for bound in g.bounds for b in bound]
        return [n for n in nodes if isinstance(n, torch.fx.Node)]

    def _rewrite_grads(self, m: MoeMatch, lowering: str) -> None:
        d, c, g = m.dispatch, m.combine, m.grads
        graph = c.wait.graph
        region = self._region(m)
        provided = self._outside_grads(m, region)
        order = {n: i for i, n in enumerate(graph.nodes)}
        readers = [u for n in provided for u in region.outside.get(n, [])]
        anchor = min([c.wait] + readers, key=order.__getitem__)
        common.hoist_before(anchor, self._grad_inputs(m))
        fake = _Fake(d.wait)
        with graph.inserting_before(anchor):
            rows = self._rows(graph, fake, m)
            f = _shape(g.gate[0])[-1]

            def flat(nodes):  # the saved values as [M, F] (the loop's per-expert pieces concatenated: a copy)
                parts = [x if len(_shape(x)) == 2 else fake.call(graph, aten.reshape.default, (x, [-1, f]))
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
            op = fake.call(
                graph, torch.ops.overlap.moe_experts_backward.default,
                (d.input, list(d.input_splits), list(d.output_splits), rows, g.offsets, sizes, flat(g.gate),
                 flat(g.up), *(self._stacked_t(graph, fake, w) for w in (g.wt_gate, g.wt_up, g.wt_down)),
                 c.group_name, lowering),
            )
            dx = fake.call(graph, operator.getitem, (op, 0))
            outs: dict[int, torch.fx.Node] = {}
            per_expert: dict[int, torch.fx.Node] = {}  # an output as [E, rows, X] (the loop over selects)
            for n, (i, e) in provided.items():
                users = region.outside.get(n, [])
                if not users:
                    continue
                if i not in outs:
                    outs[i] = fake.call(graph, operator.getitem, (op, i))
                new = self._expert_rows(graph, fake, g, outs[i], n, e, per_expert, i)
                for u in users:
                    u.replace_input_with(n, new)
        c.wait.replace_all_uses_with(dx)
        _replace_row_counts(graph, fake, m)
        # the SwiGLU derivative's nodes that read only the saved gate/up lie outside the region: dead now too,
        # as are the loop's per-expert transposed weights
        common.erase_dead(sorted(region.dying | set(g.inner) | set(g.wt_gate + g.wt_up + g.wt_down),
                                 key=lambda n: -order[n]))

    def _expert_rows(self, graph, fake, g: ExpertGrads, flat: torch.fx.Node, like: torch.fx.Node,
                     expert: int | None, per_expert: dict, key: int) -> torch.fx.Node:
        """An op output ([M, X], grouped rows) as the graph read ``like``: reshaped, or expert ``expert``'s
        rows (``per_expert[key]``: the output viewed [E, rows, X] once, for the loop over selects)."""
        if expert is None:
            if _shape_eq(_shape(flat), _shape(like)):
                return flat
            return fake.call(graph, aten.reshape.default, (flat, list(_shape(like))))
        if g.bounds:
            start, end = g.bounds[expert]
            return fake.call(graph, aten.slice.Tensor, (flat, 0, start, end))
        if key not in per_expert:
            per_expert[key] = fake.call(graph, aten.reshape.default,
                                        (flat, [len(g.pieces), g.group_sizes[0], _shape(flat)[-1]]))
        return fake.call(graph, aten.select.int, (per_expert[key], 0, expert))

    def _stacked_t(self, graph, fake, weights: list[torch.fx.Node]) -> torch.fx.Node:
        """The loop's per-expert transposed weights ``permute(select(W, 0, e), [1, 0])`` as one
        ``[E, ., .]`` tensor: ``permute(W, [0, 2, 1])`` when they all come from one ``W`` in order
        (no copy), else stacked (a copy per call)."""
        if len(weights) == 1 and val(weights[0]).dim() == 3:
            return weights[0]
        sel = [w.args[0] if w.target is aten.permute.default and list(w.args[1]) == [1, 0] else None for w in weights]
        if all(isinstance(x, torch.fx.Node) and x.target is aten.select.int and arg(x, 1, "dim") == 0
               and arg(x, 2, "index") == e for e, x in enumerate(sel)):
            bases = {x.args[0] for x in sel}
            if len(bases) == 1 and val(next(iter(bases))).shape[0] == len(weights):
                return fake.call(graph, aten.permute.default, (next(iter(bases)), [0, 2, 1]))
        return fake.call(graph, aten.cat.default, ([fake.call(graph, aten.unsqueeze.default, (w, 0)) for w in weights],))

    def _check_dtypes(self, m: MoeMatch) -> None:
        e = m.experts
        common.require_dtype(*e.gate, *e.up, *e.act, *e.down, *e.w_gate, *e.w_up, *e.w_down,
                             *(e.pieces or [e.grouped]))
        _check_row_dtypes(m, val(e.gate[0]).dtype, "the experts' output", "tokens")

    def _check_weights(self, m: MoeMatch) -> None:
        e = m.experts
        h = _shape(m.dispatch.wait)[-1]
        if e.form == "loop":
            shapes = {(_shape(g), _shape(u), _shape(w)) for g, u, w in zip(e.w_gate, e.w_up, e.w_down)}
            if len(shapes) != 1:
                raise Rejected(f"the loop's experts have weights of different shapes {sorted(shapes)}")
            (g, u, w), experts = next(iter(shapes)), len(e.w_gate)
            g, u, w = (experts, *g), (experts, *u), (experts, *w)
        else:
            g, u, w = _shape(e.w_gate[0]), _shape(e.w_up[0]), _shape(e.w_down[0])
        if len(g) != 3 or not _shape_eq(g, u) or not _shape_eq(w, (g[0], g[2], g[1])) or not _eq(g[1], h):
            raise Rejected(f"expert weights {g}, {u}, {w} are not [E, {h}, F], [E, {h}, F], [E, F, {h}]")
        if e.form == "grouped_mm" and not _shape_eq(_shape(e.offsets), (g[0],)):
            raise Rejected(f"grouped GEMM offs of shape {_shape(e.offsets)} for {g[0]} experts")
        if e.form == "bmm" and not _eq(_shape(e.grouped)[0], g[0]):
            raise Rejected(f"bmm over {_shape(e.grouped)[0]} groups but {g[0]} experts")

    # ----------------------------------------------------------------------- the region
    def _region(self, m: MoeMatch) -> _Region:
        d, c = m.dispatch, m.combine
        up_from_combine = common.ancestors(c.wait) | {c.wait}
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
            known |= {n for group in (e.gate, e.up, e.act, e.down, e.inner, e.pieces) for n in group}
        else:
            g = m.grads
            known |= set(g.gemms + g.inner + g.pieces + g.joins)
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
        return _Region(nodes, dying, outside, known)

    def _roles(self, m: MoeMatch) -> dict:
        """Region node -> (saved value, expert index or None) for the values the op can hand out."""
        e = m.experts
        roles = {m.dispatch.wait: ("recv", None)}
        cd = val(e.gate[0]).dtype
        if val(e.grouped).dtype == cd:
            roles[e.grouped] = ("xg", None)
        for name, group in (("gate", e.gate), ("up", e.up), ("act", e.act)):
            for i, n in enumerate(group):
                roles[n] = (name, i if e.form == "loop" else None)
        if e.form == "loop":
            for i, p in enumerate(e.pieces):
                if val(p).dtype == cd:
                    roles.setdefault(p, ("xg", i))
        return roles

    def _plan_outside(self, m: MoeMatch, region: _Region) -> set[str]:
        """The saved values the op must return; :class:`Rejected` when a read value cannot be provided."""
        roles = self._roles(m)
        d, c = m.dispatch, m.combine
        forbidden = {m.experts.down_out, *m.experts.down, c.collective, *(s.node for s in m.out_steps)}
        need: set[str] = set()

        def visit(n: torch.fx.Node, seen: set) -> None:
            if n in roles:
                need.add(roles[n][0])
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
                _only_row_counts(n, users)
                continue
            if n in forbidden:
                raise Rejected(f"{n.name} (the experts' output) is also used by {[u.name for u in users]}")
            visit(n, set())
        return need

    def _op_inputs(self, m: MoeMatch) -> list[torch.fx.Node]:
        e = m.experts
        nodes = [m.dispatch.input] + [x for x in m.dispatch.output_splits + m.dispatch.input_splits]
        nodes += [i for s in m.in_steps for i in (s.index or [])]
        nodes += [s.base for s in m.in_steps if s.base is not None]
        nodes += e.w_gate + e.w_up + e.w_down + ([e.offsets] if e.offsets is not None else [])
        nodes += list(e.group_sizes or [])
        return [n for n in nodes if isinstance(n, torch.fx.Node)]

    # -------------------------------------------------------------------------- rewrite
    def rewrite(self, m: MoeMatch, lowering: str) -> None:
        if m.grads is not None:
            return self._rewrite_grads(m, lowering)
        d, c, e = m.dispatch, m.combine, m.experts
        graph = c.wait.graph
        region = self._region(m)
        need = self._plan_outside(m, region)
        order = {n: i for i, n in enumerate(graph.nodes)}
        readers = [u for n, users in region.outside.items() if n not in (d.collective, c.collective) for u in users]
        anchor = min([c.wait] + readers, key=order.__getitem__)
        common.hoist_before(anchor, self._op_inputs(m))
        fake = _Fake(d.wait)
        with graph.inserting_before(anchor):
            rows = self._rows(graph, fake, m)
            w_gate, w_up, w_down = (self._stacked(graph, fake, ws) for ws in (e.w_gate, e.w_up, e.w_down))
            saved = [name in need for name in SAVED]
            op = fake.call(
                graph, torch.ops.overlap.moe_experts.default,
                (d.input, list(d.input_splits), list(d.output_splits), rows, e.offsets,
                 [] if e.offsets is not None else list(e.group_sizes), w_gate, w_up, w_down,
                 c.group_name, lowering, saved, *((m.comm_sms,) if m.comm_sms >= 0 else ())),
            )
            out = fake.call(graph, operator.getitem, (op, 0))
            values = fake.call(graph, operator.getitem, (op, 1))
            provided = {name: fake.call(graph, operator.getitem, (values, i)) for i, name in enumerate(SAVED) if saved[i]}
            self._provide_outside(graph, fake, m, region, provided)
        c.wait.replace_all_uses_with(out)
        _replace_row_counts(graph, fake, m)
        common.erase_dead(sorted(region.dying | set(e.w_gate + e.w_up + e.w_down), key=lambda n: -order[n]))

    def _rows(self, graph, fake, m: MoeMatch) -> torch.fx.Node:
        """``rows``: the in-chain row moves replayed on ``arange(N_recv)``."""
        recv = val(m.dispatch.wait)
        n = _total(graph, fake, m.dispatch.output_splits)
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
                shape = list(s.base.args[0])
                base = fake.call(graph, aten.full.default, (shape[:-1] + [1], -1), dict(dtype=torch.int64, device=recv.device))
                ids = fake.call(graph, aten.index_put.default, (base, s.index, ids))
        return fake.call(graph, aten.reshape.default, (ids, [-1]))

    def _stacked(self, graph, fake, weights: list[torch.fx.Node]) -> torch.fx.Node:
        if len(weights) == 1 and val(weights[0]).dim() == 3:
            return weights[0]
        bases = {w.args[0] for w in weights if w.target is aten.select.int and arg(w, 1, "dim") == 0}
        if len(bases) == 1 and all(arg(w, 2, "index") == i for i, w in enumerate(weights)):
            (base,) = bases
            if all(w.target is aten.select.int for w in weights) and val(base).shape[0] == len(weights):
                return base
        # per-expert weights of different tensors: stacked (a copy per call); cat of unsqueezes, as
        # decomposed graphs write stack
        rows = [fake.call(graph, aten.unsqueeze.default, (w, 0)) for w in weights]
        return fake.call(graph, aten.cat.default, (rows,))

    def _provide_outside(self, graph, fake, m: MoeMatch, region: _Region, provided: dict) -> None:
        """Point every outside reader of a region value at the op's saved values (or a copy of the
        cheap nodes between them)."""
        roles = self._roles(m)
        e = m.experts
        cache: dict[torch.fx.Node, torch.fx.Node] = {}
        per_expert: dict[torch.fx.Node, torch.fx.Node] = {}  # a saved value split into the loop's experts

        def flat_to(flat: torch.fx.Node, like: torch.fx.Node, expert: int | None) -> torch.fx.Node:
            if expert is None:
                if _shape_eq(_shape(like), _shape(flat)):
                    return flat
                return fake.call(graph, aten.reshape.default, (flat, list(_shape(like))))
            if e.split is not None:
                if flat not in per_expert:
                    per_expert[flat] = fake.call(graph, aten.split_with_sizes.default, (flat, list(e.group_sizes)))
                return fake.call(graph, operator.getitem, (per_expert[flat], expert))
            if flat not in per_expert:
                shape = [len(e.gate), e.group_sizes[0], _shape(flat)[-1]]
                per_expert[flat] = fake.call(graph, aten.reshape.default, (flat, shape))
            return fake.call(graph, aten.select.int, (per_expert[flat], 0, expert))

        def get(n: torch.fx.Node) -> torch.fx.Node:
            if n in cache:
                return cache[n]
            if n in roles:
                name, expert = roles[n]
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


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x is y or (isinstance(x, int) and isinstance(y, int) and x == y) for x, y in zip(a, b))


def _is_row_count(node: torch.fx.Node) -> bool:
    return node.target is aten.sym_size.int and arg(node, 1, "dim") == 0


def _check_row_dtypes(m: MoeMatch, cd: torch.dtype, out_what: str, rows_what: str) -> None:
    """The rows' dtypes around the block, either direction: the all-to-alls in a supported dtype, the
    grouped result (``m.out_node``) in the compute dtype ``cd``, casts only to ``cd`` or to the
    dispatched rows' dtype, and the combine sending what the dispatch sent."""
    common.require_dtype(m.dispatch.input, m.dispatch.wait, m.combine.input)
    out = m.out_node
    if val(out).dtype != cd:
        raise Rejected(f"{out_what} {out.name} is {val(out).dtype}, not {cd}")
    xdtype = val(m.dispatch.input).dtype
    for s in m.in_steps + m.out_steps:
        if s.kind == "cast" and val(s.node).dtype not in (cd, xdtype):
            raise Rejected(f"{s.node.name} casts rows to {val(s.node).dtype} (compute {cd}, {rows_what} {xdtype})")
    if xdtype != val(m.combine.input).dtype:
        raise Rejected(f"the combine sends {val(m.combine.input).dtype} rows, the dispatch {xdtype}")


def _only_row_counts(collective: torch.fx.Node, users: list) -> None:
    """An all-to-all of the block may be read outside it only by ``sym_size(·, 0)`` (its row count)."""
    bad = [u.name for u in users if not _is_row_count(u)]
    if bad:
        raise Rejected(f"the all-to-all {collective.name} is also read by {bad}")


def _replace_row_counts(graph, fake, m: MoeMatch) -> None:
    """``sym_size(all_to_all, 0)`` (the row counts a forward saves for backward) becomes the sum of its splits."""
    for coll, splits in ((m.dispatch.collective, m.dispatch.output_splits), (m.combine.collective, m.combine.output_splits)):
        for u in list(coll.users):
            if _is_row_count(u):
                with graph.inserting_before(u):
                    u.replace_all_uses_with(_total(graph, fake, splits))
                graph.erase_node(u)


def _total(graph, fake, splits: list):
    if all(isinstance(s, int) for s in splits):
        return sum(splits)
    return fake.call(graph, torch.sym_sum, (list(splits),))


class _Fake:
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
