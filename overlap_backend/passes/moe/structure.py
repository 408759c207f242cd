"""What a MoE match is: the all-to-all pair, the row moves, the experts (forward) or their input
gradients (backward), and the small vocabulary every stage of the pass shares (op groups, shapes)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..fx import arg, val

aten = torch.ops.aten
prims = torch.ops.prims

GEMMS = (aten.bmm.default, aten._grouped_mm.default, aten.mm.default)
# Grouped GEMMs by schema name: ``transformers::grouped_mm_fallback(input, weight, offs)`` (what transformers
# calls under torch.compile for weights that are not bfloat16) takes ``_grouped_mm``'s first three arguments
# and computes the same; its namespace exists only once transformers is imported.
GROUPED_GEMMS = ("aten::_grouped_mm", "transformers::grouped_mm_fallback")


def is_grouped(target) -> bool:
    """Is ``target`` a grouped GEMM (``aten._grouped_mm`` or an op that computes the same)?"""
    return isinstance(target, torch._ops.OpOverload) and target._schema.name in GROUPED_GEMMS


def is_gemm(n) -> bool:
    """Is ``n`` an expert GEMM node (``bmm``, ``mm`` or a grouped GEMM)?"""
    return isinstance(n, torch.fx.Node) and (n.target in GEMMS or is_grouped(n.target))


def same_kind(target, kind) -> bool:
    """``target`` is a GEMM of kind ``kind`` (one of ``GEMMS``; any grouped GEMM for ``_grouped_mm``)."""
    return target is kind or (is_grouped(target) and is_grouped(kind))
CASTS = (prims.convert_element_type.default,)
FILLS = (aten.full.default, aten.zeros.default, aten.empty.memory_format, aten.new_zeros.default, aten.new_empty.default)


class NoMatch(Exception):
    """The structure is not the MoE block; the message says where it differs."""


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
    # fused gate/up: the one GEMM per group whose output halves are G and U (w_gate, w_up then both
    # hold its weight [E, H, 2F] / the loop's [H, 2F] per expert); empty for separate gate and up
    fused: list[torch.fx.Node] = field(default_factory=list)
    gate_first: bool = True  # fused: G is the first half of the 2F columns


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
    # fused gate/up: dX = cat(dG, dU) @ Wt per group, ``d_fused`` the cat (what the weight gradient also
    # reads); wt_gate and wt_up then both hold the fused transposed weight [E, 2F, H]
    d_fused: list[torch.fx.Node] = field(default_factory=list)
    gate_first: bool = True


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


# ------------------------------------------------------------------------------ shapes and nodes
def shape_of(n: torch.fx.Node) -> tuple:
    """The shape of ``n``'s value (its sizes may be SymInts)."""
    return tuple(val(n).shape)


def is_static(shape) -> bool:
    """Are all of ``shape``'s sizes ints?"""
    return all(isinstance(s, int) for s in shape)


def size_eq(a, b) -> bool:
    """``a == b`` for sizes that may be SymInts, without guarding (unknown counts as unequal)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return statically_known_true(a == b)


def shape_eq(a, b) -> bool:
    """:func:`size_eq` for every dim (and as many dims)."""
    return len(a) == len(b) and all(size_eq(x, y) for x, y in zip(a, b))


def is_zero_fill(base: torch.fx.Node) -> bool:
    """Is ``base`` a tensor of zeros (``zeros`` or ``full(..., 0)``)?"""
    if base.target is aten.zeros.default:
        return True
    return base.target is aten.full.default and base.args[1] == 0


def describe_node(n: Any) -> str:
    """A node as the rejection messages name it: its op and name."""
    if not isinstance(n, torch.fx.Node):
        return repr(n)
    return f"{getattr(n.target, '__name__', n.target)} ({n.name})" if n.op == "call_function" else f"{n.op} {n.name}"


_SHAPE_OPS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.expand.default,
              aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.permute.default)


def _is_identity(chain: list[torch.fx.Node]) -> bool:
    """Do the shape ops ``chain`` (last applied first) give back their input, element for element?
    Replayed on concrete ids for static shapes; symbolic ones only as views to the same shape."""
    src = chain[-1].args[0]
    shapes = [shape_of(src)] + [shape_of(c) for c in chain]
    if not all(is_static(sh) for sh in shapes):
        return all(c.target in (aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.expand.default)
                   and shape_eq(shape_of(c), shape_of(c.args[0])) for c in chain)
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        ids = torch.arange(math.prod(shapes[0])).reshape(shapes[0])
        out = ids
        try:
            for c in reversed(chain):
                out = c.target(out, *c.args[1:], **c.kwargs)
        except RuntimeError:  # (not replayable on a contiguous input: not taken for the identity)
            return False
        return tuple(out.shape) == tuple(ids.shape) and torch.equal(out, ids)


def look_through(n: Any, into: list | None = None) -> Any:
    """``n`` without the shape ops around it that compose to the identity (``x @ w`` on 3-D tensors
    decomposes to ``view(bmm(view(expand(x)), view(expand(w))))`` to the same shapes, ``einsum`` to
    unsqueezes, permutes and views); the nodes skipped are appended to ``into``."""
    chain, cur, best = [], n, None
    while isinstance(cur, torch.fx.Node) and cur.target in _SHAPE_OPS and isinstance(cur.args[0], torch.fx.Node):
        chain.append(cur)
        cur = cur.args[0]
        if shape_eq(shape_of(cur), shape_of(n)) and _is_identity(chain):
            best = (cur, list(chain))
    if best is None:
        return n
    if into is not None:
        into.extend(best[1])
    return best[0]


def gemm_operands(n: Any, kind, into: list | None = None) -> tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node | None]:
    """``n = kind(a, b[, offs])``: ``(a, b, offs)``, looking through no-op views of ``n``, ``a`` and
    ``b`` (appended to ``into``)."""
    n = look_through(n, into)
    if not (isinstance(n, torch.fx.Node) and same_kind(n.target, kind)):
        raise NoMatch(f"expected a {kind.__name__} where {describe_node(n)} is")
    a, b = look_through(n.args[0], into), look_through(n.args[1], into)
    offs = arg(n, 2, "offs") if is_grouped(kind) else None
    if is_grouped(kind) and (arg(n, 3, "bias") is not None or arg(n, 4, "out_dtype") is not None):
        raise NoMatch(f"{n.name}: grouped GEMM with a bias or an out_dtype")
    return a, b, offs
