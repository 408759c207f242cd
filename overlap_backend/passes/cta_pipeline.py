"""Pass ``cta_pipeline``: the tensor-parallel MLP  ⇒  ``torch.ops.overlap.cta_pipeline_mlp``.

Matches, in INFERENCE graphs only, the row-parallel MLP as users write it::

    h   = x @ w1 (+ b1)                           # column-parallel: mm/addmm (→ reshape) (→ + b1)
    a   = gelu(h)  |  silu(h) * (x @ w3 (+ b3))   # GELU (erf or tanh), or SwiGLU
    y   = a @ w2 (+ b2)                           # row-parallel: (reshape →) mm/addmm (→ reshape) (→ + b2)
    out = wait_tensor(all_reduce(y, "sum"))

and replaces it by ONE ``cta_pipeline_mlp`` op (→ reshape to ``y``'s shape). Off by default: it runs
when listed in ``OVERLAP_PASSES`` / ``make_backend(passes=[...])``, or, where the passes were not
named, model-gated: where the active cost model predicts a win (``cost/model.py``). It runs
before ``mm_ar`` (registry order in ``passes/__init__.py``), which would otherwise claim the
``mm → all_reduce`` tail.

The activations are matched in their decomposed post-grad form with Inductor's matcher: the
patterns are traced from ``F.gelu`` / ``F.silu(g) * u`` by ``gen_pattern`` (the same
decompositions the backend's graphs went through), so they follow the decomposition table.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
import torch.fx
import torch.nn.functional as F

from ..cost import Problem, active
from ..runtime.lowering import available
from . import lowerings
from .collectives import AllReduce, find_all_reduces
from .fx import RESHAPES, ancestors, aten, call, device_type, dtype_name, erase_dead, val
from .manager import OverlapPass
from .matmuls import Matmul, is_flatten_to_2d, producer_matmul
from .preconditions import (require_backed, require_bias_vector, require_dtype, require_group, require_min_numel,
                            require_static)
from .rejected import Rejected
from .sizes import hint, known_eq, prod, require_sizes_available, size_args


@functools.cache
def _activation_patterns():
    """(activation, approximate, pattern) with KeywordArgs ``v`` (GELU) or ``g``/``u`` (SwiGLU)."""
    from torch._inductor.pattern_matcher import fwd_only, gen_pattern


    def gelu_none(v):
        return F.gelu(v)

    def gelu_tanh(v):
        return F.gelu(v, approximate="tanh")

    def swiglu(g, u):
        return F.silu(g) * u

    def swiglu_rev(g, u):
        return u * F.silu(g)

    def entry(activation, approximate, fn, ex):
        traced = fwd_only(fn, ex)
        consts = pattern_constants(n for n in traced.graph.nodes if n.op == "call_function")
        return activation, approximate, gen_pattern(fn, ex, fwd_only), consts

    # One set per dtype: for float16/bfloat16 the decompositions compute in float32 between
    # convert_element_type nodes, which the patterns must hold too.
    out = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        ex1 = [torch.empty(4, 4, dtype=dtype)]
        ex2 = [torch.empty(4, 4, dtype=dtype), torch.empty(4, 4, dtype=dtype)]
        out += [
            entry("gelu", "tanh", gelu_tanh, ex1),
            entry("gelu", "none", gelu_none, ex1),
            entry("swiglu", "none", swiglu, ex2),
            entry("swiglu", "none", swiglu_rev, ex2),
        ]
    return out


def pattern_constants(nodes) -> list[str]:
    """The scalar arguments of ``nodes``, sorted: the matcher ignores them (``gen_pattern`` turns
    constants into ``Ignored()``), so a match is only a GELU when they are GELU's constants."""
    out = []
    for n in nodes:
        for a in (*n.args, *n.kwargs.values()):
            if isinstance(a, (int, float)) and not isinstance(a, bool):
                out.append(repr(float(a)))
    return sorted(out)


@dataclass
class Linear:
    """``mm``/``addmm`` (→ reshape) (→ ``add`` of a bias vector)."""

    matmul: Matmul
    reshape: torch.fx.Node | None
    bias_add: torch.fx.Node | None

    @property
    def bias(self) -> torch.fx.Node | None:
        if self.bias_add is not None:
            a, b = self.bias_add.args[:2]
            return b if a in (self.matmul.node, self.reshape) else a
        return self.matmul.bias

    @property
    def nodes(self) -> list[torch.fx.Node]:
        return [n for n in (self.matmul.node, self.reshape, self.bias_add) if n is not None]

    @property
    def out(self) -> torch.fx.Node:
        return self.nodes[-1]


def _is_vector(node, n: int) -> bool:
    v = val(node)
    return isinstance(node, torch.fx.Node) and isinstance(v, torch.Tensor) and v.dim() == 1 and v.shape[0] == n


def as_linear(node) -> Linear | None:
    """The linear layer whose result ``node`` is, or None."""
    if not isinstance(node, torch.fx.Node):
        return None
    if node.target is aten.add.Tensor and len(node.args) == 2 and not node.kwargs:
        out = val(node)
        for inner, bias in (node.args, node.args[::-1]):
            if not isinstance(inner, torch.fx.Node) or out is None:
                continue
            mm, reshape = producer_matmul(inner)
            if mm is not None and mm.bias is None and _is_vector(bias, out.shape[-1]):
                if tuple(val(inner).shape) == tuple(out.shape):
                    return Linear(mm, reshape, node)
    mm, reshape = producer_matmul(node)
    return Linear(mm, reshape, None) if mm is not None else None


def _source(node: torch.fx.Node) -> torch.fx.Node:
    """``node`` without a flattening reshape in front (the x fed to a linear layer)."""
    return node.args[0] if isinstance(node, torch.fx.Node) and is_flatten_to_2d(node) else node


@dataclass
class CtaMatch:
    reduce: AllReduce
    down: Linear  # y = a @ w2 (+ b2)
    act_in: torch.fx.Node | None = None  # reshape between the activation and the down GEMM
    act: torch.fx.Node | None = None  # the activation's output node
    act_nodes: list[torch.fx.Node] = field(default_factory=list)
    activation: str | None = None
    approximate: str = "none"
    up: Linear | None = None  # x @ w1 (+ b1)
    gate_up: Linear | None = None  # x @ w3 (+ b3) (SwiGLU's second projection)
    why_not: str | None = None  # set when the pattern is incomplete (reported by check)
    stages: int | None = None  # the op's ``stages`` (set by check: OVERLAP_CTA_STAGES or the model's pick)

    def matched_nodes(self) -> list[torch.fx.Node]:
        pre = []
        for lin in (self.up, self.gate_up):
            if lin is not None:
                pre += lin.nodes
        mid = self.act_nodes + ([self.act_in] if self.act_in is not None else [])
        # dict.fromkeys: silu(h) * h reaches h through both projections
        return list(dict.fromkeys(pre + mid + self.down.nodes + self.reduce.nodes))


def _match_activation(node: torch.fx.Node):
    for activation, approximate, pattern, consts in _activation_patterns():
        m = pattern.match(node)
        if m and pattern_constants(n for n in m.nodes if isinstance(n, torch.fx.Node)) == consts:
            return activation, approximate, m
    return None


def find_mlps(graph: torch.fx.Graph) -> list[CtaMatch]:
    """Every ``linear → activation → linear → all_reduce`` chain (only looks at the graph)."""
    found = []
    for ar in find_all_reduces(graph):
        down = as_linear(ar.input)
        if down is None:
            continue  # not a matmul: mm_ar reports it
        m = CtaMatch(ar, down)
        found.append(m)
        a = down.matmul.a
        if a.target in RESHAPES:
            m.act_in, a = a, a.args[0]
        hit = _match_activation(a) if isinstance(a, torch.fx.Node) else None
        if hit is None:
            m.why_not = f"{a.name} (input of the row-parallel matmul) is not GELU or silu(a) * b"
            continue
        m.activation, m.approximate, pm = hit
        m.act = a
        m.act_nodes = [n for n in pm.nodes if isinstance(n, torch.fx.Node)]
        first = pm.kwargs.get("v" if m.activation == "gelu" else "g")
        m.up = as_linear(first)
        if m.up is None:
            m.why_not = f"the activation's input {getattr(first, 'name', first)} is not produced by a matmul"
            continue
        if m.activation == "swiglu":
            second = pm.kwargs.get("u")
            m.gate_up = as_linear(second)
            if m.gate_up is None:
                m.why_not = f"silu(a) * b: b ({getattr(second, 'name', second)}) is not produced by a matmul"
    return found


def _same_shape(a, b) -> bool:
    """Known equal for every value of the symbols (no guard)."""
    return len(a) == len(b) and all(known_eq(x, y) for x, y in zip(a, b))


class CtaPipelinePass(OverlapPass):
    name = "cta_pipeline"

    def find(self, graph):
        found = find_mlps(graph)
        if self.gated:
            # Not named by the user: the pass runs because the cost model may turn it on where it
            # predicts a win. It looks only at complete MLPs of inference graphs where the model is
            # active (the others are mm_ar's to report), so it adds nothing elsewhere.
            if self.ctx.graph_kind != "inference":
                return []
            found = [m for m in found if m.why_not is None
                     and active(self.ctx.config, device_type(m.reduce.input))]
        return found

    def key(self, m: CtaMatch):
        return m.reduce.collective

    def describe(self, m: CtaMatch):
        return [n.name for n in m.matched_nodes()]

    def check(self, m: CtaMatch) -> str:
        ar, up, gu, down = m.reduce, m.up, m.gate_up, m.down
        if self.ctx.graph_kind != "inference":
            raise Rejected(
                f"cta_pipeline rewrites inference graphs only; this is a {self.ctx.graph_kind} graph "
                "(training: the op has no backward)"
            )
        if m.why_not is not None:
            raise Rejected(m.why_not)
        require_group(ar.group_name)
        if ar.reduce_op != "sum":
            raise Rejected(f"reduce op {ar.reduce_op!r} is not 'sum': not a row-parallel MLP")
        x = up.matmul.a
        if gu is not None and _source(gu.matmul.a) is not _source(x):
            raise Rejected(f"the two projections of silu(a) * b read different inputs ({x.name}, {gu.matmul.a.name})")
        operands = [x, up.matmul.b, down.matmul.b] + ([gu.matmul.b] if gu is not None else [])
        # the token count may be symbolic (backed: decided by hint + guard); the weights are static
        require_backed(*operands, ar.input)
        require_static(*operands[1:])
        require_dtype(*operands)
        for v_lin in (up, gu, down):
            if v_lin is None:
                continue
            if v_lin.bias_add is not None and v_lin.matmul.bias is not None:
                raise Rejected(f"{v_lin.matmul.node.name} has a bias twice")
            require_bias_vector(v_lin.matmul)
        f = val(up.matmul.node).shape[1]
        for lin in (up, gu):
            if lin is not None and not (known_eq(val(lin.out).shape[-1], f)
                                        and _same_shape(val(lin.out).shape, val(m.act).shape)):
                raise Rejected(f"{lin.out.name} {tuple(val(lin.out).shape)} is not the activation's [..., {f}] input")
        if m.act_in is not None and not is_flatten_to_2d(m.act_in):
            raise Rejected(f"{m.act_in.name} does not flatten the activation to [rows, F]")
        if gu is not None and not _same_shape(val(gu.matmul.node).shape, val(up.matmul.node).shape):
            raise Rejected("the two projections of silu(a) * b have different shapes")
        if not (known_eq(val(down.matmul.a).shape[1], f)
                and known_eq(val(m.act).numel(), val(up.matmul.node).numel())):
            raise Rejected("the activation's shape does not match the two matmuls")
        # Intermediate values must feed nothing outside the match.
        matched = set(m.matched_nodes())
        internal = [n for n in matched if n is not ar.wait]
        for node in internal:
            others = [u for u in node.users if u not in matched]
            if others:
                raise Rejected(f"{node.name} is also used by {[u.name for u in others]}")
        # Operands must not be computed from the matched intermediates.
        bias_nodes = [b for b in (up.bias, gu.bias if gu else None, down.bias) if b is not None]
        for op in operands + bias_nodes:
            if (ancestors(op) | {op}) & set(internal):
                raise Rejected(f"operand {op.name} depends on the matched MLP")
        require_min_numel(self.ctx, prod(val(down.matmul.node).shape))
        require_sizes_available(ar.wait.graph, val(ar.input).shape, ar.wait)
        lowering = lowerings.choose_lowering(self.ctx, ar.group_name, device_type(ar.wait))
        lowering = lowering if lowering in available("cta_pipeline_mlp") else "p2p"
        ws = require_group(ar.group_name)
        stages = self.ctx.config.cta_stages
        problem = Problem(
            "cta_pipeline_mlp", m=hint(val(up.matmul.node).shape[0]), k=val(up.matmul.b).shape[0], f=f,
            n=val(down.matmul.b).shape[1], dtype=dtype_name(x), ws=ws, activation=m.activation,
        )
        # the symm kernels run 2 stages of ws/2 ranks; other stage counts fall back to p2p at run time
        symm_runs = ws % 2 == 0 and stages in (2, "auto")
        decision = self.decide(problem, ar.group_name, device_type(x), lowering, symm_runs=symm_runs, stages=stages)
        m.stages = decision.stages
        return decision.lowering

    def rewrite(self, m: CtaMatch, lowering: str) -> None:
        ar, up, gu, down = m.reduce, m.up, m.gate_up, m.down
        graph = ar.wait.graph
        args = (
            up.matmul.a, up.matmul.b, up.bias,
            gu.matmul.b if gu else None, gu.bias if gu else None,
            down.matmul.b, down.bias,
            m.activation, m.approximate, m.stages or 2, ar.group_name, lowering,
        )
        with graph.inserting_before(ar.wait):
            result = call(graph, torch.ops.overlap.cta_pipeline_mlp.default, args)
            if not _same_shape(val(ar.input).shape, val(result).shape):
                shape = size_args(graph, val(ar.input).shape, ar.wait)
                result = call(graph, aten.reshape.default, (result, shape))
        ar.wait.replace_all_uses_with(result)
        ar.collective.replace_all_uses_with(result, delete_user_cb=lambda user: user is not ar.wait)
        extra = [gu.matmul.a] if gu is not None and gu.matmul.a is not up.matmul.a else []
        erase_dead(list(reversed(m.matched_nodes())) + extra)
