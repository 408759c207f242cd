"""Finding tensor-parallel experts' all-reduces (only looks; ``__init__`` judges and rewrites).

Forward, from the all-reduced tensor back to the down GEMM::

    sum(view(Z, [T, k, N]), [1])          Z = index(Zs, [slot_rows])  (optional: the un-permutation)
    Zs = mul(R, scale [M, 1])             (optional: the routing weight per row, either operand order)
    R  = where(mask [M, 1], 0, Y)         (optional: AllReduceEP's mask of the other ranks' experts)
    Y  = transformers::grouped_mm_fallback(a, w, offs) | aten._grouped_mm(a, w, offs)
       | squeeze(bmm(index(W [E, N, K], [ids]), unsqueeze(a, -1)), -1)   (batched_mm: per-row weights)

Backward, from the all-reduced tensor back to the input-gradient GEMM::

    index_put(full([T, N], 0), [tokens], D, accumulate=True)
    D = where(mask, 0, D0)                (optional)
    D0 = getitem(transformers::grouped_mm_fallback_backward(x, W, offs, g), 0)   (W^T is the GEMM's weight;
         its getitem 1, the weight gradient, is computed by the same op) | aten._grouped_mm(g, w, offs)

An all-reduce is a candidate when its input reaches one of those GEMMs through the ops above; a
candidate whose structure differs says where (``error``), so the report names why it is left alone.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
import torch.fx

from ..collectives import AllReduce
from ..fx import RESHAPES, aten, arg, val
from ..sizes import known_eq

FALLBACK = "transformers::grouped_mm_fallback"
FALLBACK_BACKWARD = "transformers::grouped_mm_fallback_backward"
_WALK = {aten.sum.dim_IntList, *RESHAPES, aten.index.Tensor, aten.mul.Tensor, aten.where.self, aten.squeeze.dim,
         aten.index_put.default, operator.getitem}
_ZERO_FILLS = (aten.full.default, aten.zeros.default)


def op_name(node) -> str:
    target = getattr(node, "target", None)
    return target.name() if isinstance(target, torch._ops.OpOverload) else ""


def _is_gemm(node) -> bool:
    return isinstance(node, torch.fx.Node) and (
        op_name(node) in (FALLBACK, FALLBACK_BACKWARD) or node.target in (aten._grouped_mm.default, aten.bmm.default))


def reaches_expert_gemm(node: torch.fx.Node, depth: int = 8) -> bool:
    """Does ``node`` reach a grouped / batched GEMM through the ops this pass takes?"""
    frontier = [node]
    for _ in range(depth):
        nxt = []
        for n in frontier:
            if _is_gemm(n):
                return True
            if n.op == "call_function" and n.target in _WALK:
                nxt += n.all_input_nodes
        frontier = nxt
    return False


@dataclass
class Gemm:
    """``Y[j] = a[j] @ w[e(j)]``: ``w`` a node ``[E, K, N]``, or (``w_source``, ``w_perm``): the op's
    weight is ``permute(w_source, w_perm)``, written by the rewrite."""

    node: torch.fx.Node  # the node whose value is Y
    a: torch.fx.Node
    offsets: torch.fx.Node | None = None
    expert_ids: torch.fx.Node | None = None
    w: torch.fx.Node | None = None
    w_source: torch.fx.Node | None = None
    w_perm: tuple[int, ...] | None = None
    x: torch.fx.Node | None = None  # fallback backward: the forward input, for the weight gradient
    weight_grad: torch.fx.Node | None = None  # fallback backward: getitem 1
    bmm: torch.fx.Node | None = None  # batched form: the [M, N, 1] bmm, whose other readers get unsqueeze(Y)
    nodes: list[torch.fx.Node] = field(default_factory=list)  # the GEMM's own nodes


@dataclass
class TpExpertsMatch:
    reduce: AllReduce
    backward: bool
    error: str | None = None  # why the structure is not the one this pass rewrites
    gemm: Gemm | None = None
    chain: list[torch.fx.Node] = field(default_factory=list)  # reduce input back to (excluding) the GEMM
    rows: torch.fx.Node | None = None  # forward: the value before the routing weight (may have other readers)
    mask: torch.fx.Node | None = None
    scale: torch.fx.Node | None = None
    slot_rows: torch.fx.Node | None = None
    top_k: int | None = None
    tokens: torch.fx.Node | None = None
    num_tokens: object = None
    extra: list[torch.fx.Node] = field(default_factory=list)  # matched constants (the zero of where, the full)
    rows_readers: list[torch.fx.Node] = field(default_factory=list)  # forward: other readers of ``rows`` (check)
    bmm_readers: list[torch.fx.Node] = field(default_factory=list)  # batched form: other readers of the bmm


class _Mismatch(Exception):
    pass


def _need(cond: bool, why: str) -> None:
    if not cond:
        raise _Mismatch(why)


def _is_zero(x) -> bool:
    if isinstance(x, (int, float)):
        return x == 0
    return (isinstance(x, torch.fx.Node) and x.target is aten.scalar_tensor.default and x.args
            and isinstance(x.args[0], (int, float)) and x.args[0] == 0)


def _mask(m: TpExpertsMatch, node: torch.fx.Node) -> torch.fx.Node:
    """``where(mask, 0, inner)`` -> inner (recording mask); other nodes unchanged."""
    if node.target is not aten.where.self:
        return node
    cond, zero, inner = node.args[:3]
    _need(_is_zero(zero), f"{node.name} keeps the rows where {cond.name} holds, not zeros them")
    _need(isinstance(inner, torch.fx.Node), f"{node.name} selects no graph value")
    cv, iv = val(cond), val(inner)
    _need(cv is not None and cv.dtype == torch.bool and cv.dim() == 2 and known_eq(cv.shape[1], 1)
          and known_eq(cv.shape[0], iv.shape[0]), f"the mask {cond.name} of {node.name} is not one flag per row")
    m.mask = cond
    m.chain.append(node)
    if isinstance(zero, torch.fx.Node):
        m.extra.append(zero)
    return inner


def _gemm_forward(node: torch.fx.Node) -> Gemm:
    if op_name(node) == FALLBACK or node.target is aten._grouped_mm.default:
        if node.target is aten._grouped_mm.default:
            _need(arg(node, 3, "bias") is None and arg(node, 4, "out_dtype") is None,
                  f"{node.name} has a bias or an output dtype")
        a, w, offs = node.args[0], node.args[1], arg(node, 2, "offs")
        _need(isinstance(offs, torch.fx.Node), f"{node.name} has no group offsets")
        _need(val(w) is not None and val(w).dim() == 3 and val(a).dim() == 2, f"{node.name} is not a 2-D x 3-D grouped GEMM")
        return Gemm(node, a, offsets=offs, w=w, nodes=[node])
    # batched_mm: squeeze(bmm(index(W, [ids]), unsqueeze(a, -1)), -1)
    _need(node.target is aten.squeeze.dim and arg(node, 1, "dim") in (-1, 2), f"{node.name} is not an expert GEMM")
    bmm = node.args[0]
    _need(isinstance(bmm, torch.fx.Node) and bmm.target is aten.bmm.default, f"{node.name} is not an expert GEMM")
    sel, col = bmm.args[:2]
    _need(sel.target is aten.index.Tensor and len(sel.args[1]) == 1 and sel.args[1][0] is not None,
          f"{bmm.name} does not read weights gathered per row")
    _need(col.target is aten.unsqueeze.default and arg(col, 1, "dim") in (-1, 2), f"{bmm.name} does not read rows")
    w_src, ids = sel.args[0], sel.args[1][0]
    _need(val(w_src).dim() == 3 and val(ids).dim() == 1 and val(ids).dtype == torch.int64,
          f"{sel.name} is not one [N, K] weight per row")
    nodes = [node, bmm, sel, col]  # the gathered weights and rows may have other readers: they stay then
    return Gemm(node, col.args[0], expert_ids=ids, w_source=w_src, w_perm=(0, 2, 1), nodes=nodes, bmm=bmm)


def match_forward(ar: AllReduce) -> TpExpertsMatch | None:
    s = ar.input
    if s.op != "call_function" or s.target is not aten.sum.dim_IntList or not reaches_expert_gemm(s):
        return None
    m = TpExpertsMatch(ar, backward=False)
    try:
        dims, keep = arg(s, 1, "dim"), arg(s, 2, "keepdim", False)
        _need(list(dims or []) == [1] and not keep and s.kwargs.get("dtype") is None,
              f"{s.name} is not a sum over the top-k slots (dim 1)")
        v = s.args[0]
        _need(v.target in RESHAPES and val(v).dim() == 3, f"{v.name} is not a [T, k, N] view of the rows")
        top_k = val(v).shape[1]
        _need(isinstance(top_k, int), f"top-k {top_k} is symbolic")
        m.top_k, m.chain = top_k, [s, v]
        z = v.args[0]
        if z.target is aten.index.Tensor:
            idx = z.args[1]
            _need(len(idx) == 1 and isinstance(idx[0], torch.fx.Node), f"{z.name} is not a row permutation")
            m.slot_rows = idx[0]
            m.chain.append(z)
            z = z.args[0]
        if z.target is aten.mul.Tensor:
            x, y = z.args[:2]
            rows_v = val(z)
            scale = next((o for o in (y, x) if isinstance(o, torch.fx.Node) and val(o).dim() == 2
                          and known_eq(val(o).shape[1], 1) and known_eq(val(o).shape[0], rows_v.shape[0])
                          and not known_eq(rows_v.shape[1], 1)), None)
            _need(scale is not None, f"{z.name} is not a scale of each row")
            m.scale = scale
            m.chain.append(z)
            z = x if scale is y else y
        m.rows = z
        y = _mask(m, z)
        m.gemm = _gemm_forward(y)
    except _Mismatch as e:
        m.error = str(e)
    return m


def is_inverse_permutation(node: torch.fx.Node, m_rows) -> bool:
    """``index_put(buf, [getitem(sort(ids), 1)], iota(M))``: the inverse of a sort's permutation."""
    if node.target is not aten.index_put.default or arg(node, 3, "accumulate", False):
        return False
    idx, values = node.args[1], node.args[2]
    if len(idx) != 1 or not isinstance(idx[0], torch.fx.Node) or idx[0].target is not operator.getitem:
        return False
    srt = idx[0].args[0]
    if idx[0].args[1] != 1 or srt.target not in (aten.sort.default, aten.sort.stable):
        return False
    if values.target is torch.ops.prims.iota.default:
        ok = arg(values, 1, "start", 0) == 0 and arg(values, 2, "step", 1) == 1
    elif values.target in (aten.arange.default, aten.arange.start):
        ok = values.target is aten.arange.default
    else:
        return False
    return ok and known_eq(val(values).shape[0], m_rows) and known_eq(val(node).shape[0], m_rows)


def _per_row_weights_bmm(node: torch.fx.Node, depth: int = 8) -> torch.fx.Node | None:
    """The ``bmm`` of per-row matrices by per-row vectors (``bmm(W_rows [M, N, K], unsqueeze(v [M, K], -1))``:
    batched_mm's form, on the expert weights gathered per (token, slot) row) that ``node`` is, through views,
    squeezes and sums (the top-k sum), or None."""
    n = node
    for _ in range(depth):
        if not (isinstance(n, torch.fx.Node) and n.op == "call_function"):
            return None
        if n.target is aten.bmm.default:
            for operand in n.args[:2]:
                if isinstance(operand, torch.fx.Node) and operand.target is aten.unsqueeze.default \
                        and val(operand.args[0]).dim() == 2 and operand.args[1] in (2, -1):
                    return n
            return None
        if n.target not in (*RESHAPES, aten.squeeze.dim, aten.sum.dim_IntList):
            return None
        n = n.args[0]
    return None


def match_backward(ar: AllReduce) -> TpExpertsMatch | None:
    p = ar.input
    if p.op == "call_function" and p.target is not aten.index_put.default and (bmm := _per_row_weights_bmm(p)):
        # batched_mm's backward: reported (the forward of that form is rewritten)
        return TpExpertsMatch(ar, backward=True, error=(
            f"the experts' input gradient {p.name} is a bmm ({bmm.name}) on per-row gathered expert weights "
            "(experts_implementation='batched_mm': [M, N, K] matrices by [M, K, 1] vectors), summed over the top-k "
            "slots, not grouped GEMM rows; experts_implementation='grouped_mm' is rewritten"))
    if p.op != "call_function" or p.target is not aten.index_put.default or not reaches_expert_gemm(p):
        return None
    m = TpExpertsMatch(ar, backward=True)
    try:
        base, idx, values = p.args[:3]
        _need(arg(p, 3, "accumulate", False), f"{p.name} overwrites rows instead of adding them")
        _need(base.target in _ZERO_FILLS and (base.target is aten.zeros.default or base.args[1] == 0),
              f"{p.name} adds the rows into {base.name}, not into zeros")
        _need(len(idx) == 1 and isinstance(idx[0], torch.fx.Node) and val(idx[0]).dim() == 1
              and val(idx[0]).dtype == torch.int64, f"{p.name} does not scatter whole rows by token")
        _need(val(base).dim() == 2 and val(values).dim() == 2 and known_eq(val(base).shape[1], val(values).shape[1])
              and val(base).dtype == val(values).dtype, f"{p.name} is not a scatter of [M, N] rows into [T, N]")
        m.tokens, m.num_tokens, m.chain, m.extra = idx[0], val(base).shape[0], [p], [base]
        d = _mask(m, values)
        if d.target is operator.getitem and op_name(d.args[0]) == FALLBACK_BACKWARD:
            _need(d.args[1] == 0, f"{d.name} is the weight gradient")
            bwd = d.args[0]
            x, w_fwd, offs, g = bwd.args[:4]
            others = [u for u in bwd.users if not (u.target is operator.getitem and u.args[1] in (0, 1))]
            _need(not others, f"{bwd.name} is read by {[u.name for u in others]}")
            dw = next((u for u in bwd.users if u.args[1] == 1), None)
            m.gemm = Gemm(d, g, offsets=offs, w_source=w_fwd, w_perm=(0, 2, 1), nodes=[d, bwd],
                          x=x if dw is not None and dw.users else None, weight_grad=dw)
            if dw is not None:
                m.gemm.nodes.insert(1, dw)
        elif d.target is aten._grouped_mm.default:
            m.gemm = _gemm_forward(d)
        else:
            raise _Mismatch(f"{d.name} is not a grouped GEMM")
    except _Mismatch as e:
        m.error = str(e)
    return m
