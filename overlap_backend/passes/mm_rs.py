"""Pass ``mm_rs``: matmul → (reshape) → reduce-scatter  ⇒  ``torch.ops.overlap.mm_rs``.

Matches every reduce-scatter (dim 0, or split/cat and slice/cat forms for other dims) whose input
is an ``mm``/``addmm``, directly or through one reshape (``mm → reshape`` of 3-D activations), and
whose matmul result feeds nothing else. A sum of such matmuls (``mm(a_q, b_q) + mm(a_k, b_k) + ...``:
the input gradient of projections that read one gathered tensor, Q/K/V or SwiGLU's w1/w3, in the
backward of tensor + sequence parallelism) is one matmul over the concatenated contraction dim,
``cat([a_i], 1) @ cat([b_i], 0)``: the op gets those two ``cat`` nodes. With ``fuse_epilogues``
the pointwise chain after the reduce-scatter (a residual add of the matching row chunk, scaling, a
cast, ...) goes into the op's ``epilogue`` (``passes/epilogue.py``): it runs on the reduced chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx

from ..cost import Problem
from . import epilogue as ep
from . import lowerings
from .collectives import ReduceScatter, find_reduce_scatters, scatter_layout_error
from .fx import call, device_type, dtype_name, erase_dead, hoist_before, val
from .manager import OverlapPass
from .matmuls import Matmul, producer_matmul, producer_matmul_sum
from .preconditions import (REDUCE_OPS, crosses_graph_break, require_backed, require_bias_vector, require_dtype,
                            require_group, require_min_numel)
from .rejected import Rejected
from .sizes import decide, hint, known_eq, prod, require_sizes_available, size_args


@dataclass
class MmRsMatch:
    scatter: ReduceScatter
    matmul: Matmul | None
    reshape: torch.fx.Node | None
    capture: ep.Capture | None = None  # the chain after the wait that the op computes (set by check)
    # a sum of matmuls: the terms after the first (``matmul``/``reshape``) and the add nodes
    more: list[tuple[Matmul, torch.fx.Node | None]] = field(default_factory=list)
    adds: list[torch.fx.Node] = field(default_factory=list)

    @property
    def terms(self) -> list[tuple[Matmul, torch.fx.Node | None]]:
        return [(self.matmul, self.reshape)] + self.more if self.matmul is not None else []


def find_match(rs: ReduceScatter) -> MmRsMatch:
    mm, reshape = producer_matmul(rs.input)
    if (mm is None or mm.bias is not None) and (summed := producer_matmul_sum(rs.input)) is not None:
        (first, *more), adds = summed
        return MmRsMatch(rs, first[0], first[1], more=more, adds=adds)
    return MmRsMatch(rs, mm, reshape)


class MmRsPass(OverlapPass):
    name = "mm_rs"

    def find(self, graph):
        return [find_match(rs) for rs in find_reduce_scatters(graph)]

    def key(self, m):
        return m.scatter.collective

    def describe(self, m: MmRsMatch):
        pre = [n for mm, reshape in m.terms for n in (mm.node, reshape) if n is not None] + m.adds
        return [n.name for n in pre + m.scatter.nodes]

    def check(self, m: MmRsMatch) -> str:
        rs, mm = m.scatter, m.matmul
        if mm is None:
            raise Rejected(f"the reduce-scattered tensor {rs.input.name} is not produced by a matmul"
                           + (f": {why}" if (why := crosses_graph_break(rs.input, upstream=True)) else ""))
        ws = require_group(rs.group_name, rs.group_size)
        if rs.reduce_op not in REDUCE_OPS:
            raise Rejected(f"reduce op {rs.reduce_op!r} not supported")
        if err := scatter_layout_error(rs, ws):
            raise Rejected(err)
        operands = [n for t, _ in m.terms for n in (t.a, t.b)]
        require_backed(*operands, rs.input)
        out_shape, mm_shape = val(rs.input).shape, val(mm.node).shape
        if not (known_eq(out_shape[-1], mm_shape[1]) and known_eq(prod(out_shape[:-1]), mm_shape[0])):
            raise Rejected(f"reshape {tuple(mm_shape)} -> {tuple(out_shape)} does not keep the matmul's rows and columns")
        require_dtype(*operands)
        require_bias_vector(mm)
        if m.more:
            self._check_sum(m)
        produced = [n for t, reshape in m.terms for n in (t.node, reshape) if n is not None] + m.adds
        for node in produced:
            others = [u for u in node.users if u not in rs.nodes and u not in produced]
            if others:
                raise Rejected(f"{node.name} is also used by {[u.name for u in others]}")
        out_shape = val(rs.input).shape
        # guard (where not known symbolically): the scattered dim splits into ws equal chunks
        if not decide(out_shape[rs.scatter_dim % len(out_shape)] % ws == 0):
            raise Rejected(f"scatter dim of {tuple(out_shape)} not divisible by {ws}")
        require_sizes_available(rs.wait.graph, out_shape, rs.wait)
        require_min_numel(self.ctx, prod(out_shape))
        lowering = lowerings.choose_lowering(self.ctx, rs.group_name, device_type(rs.wait))
        m.capture = ep.capture_after_collective(self.ctx, rs.wait, rs.collective, self._matched(m),
                                                tuple(val(rs.wait).shape), val(rs.wait).dtype)
        problem = Problem("mm_rs", m=hint(mm_shape[0]), n=hint(mm_shape[1]), k=hint(val(mm.a).shape[1]),
                          dtype=dtype_name(mm.a), ws=ws)
        return self.decide(problem, rs.group_name, device_type(mm.a), lowering).lowering

    @staticmethod
    def _check_sum(m: MmRsMatch) -> None:
        """Every term is a bias-free ``[M, K_i] @ [K_i, N]`` of the first term's ``[M, N]`` with the
        reduce-scattered shape; no add broadcasts."""
        shape = val(m.scatter.input).shape
        mm_shape = val(m.matmul.node).shape
        for t, reshape in m.terms:
            if t.bias is not None:
                raise Rejected(f"{t.node.name}: addmm (bias) in a sum of matmuls")
            ts = val(t.node).shape
            if not (known_eq(ts[0], mm_shape[0]) and known_eq(ts[1], mm_shape[1])):
                raise Rejected(f"sum of matmuls of different shapes {tuple(mm_shape)} and {tuple(ts)} ({t.node.name})")
            value = val(reshape if reshape is not None else t.node).shape
            if len(value) != len(shape) or not all(known_eq(a, b) for a, b in zip(value, shape)):
                raise Rejected(f"term {(reshape or t.node).name} {tuple(value)} of the sum is not {tuple(shape)}")
        for add in m.adds:
            if val(add).dtype != val(m.matmul.node).dtype:
                raise Rejected(f"{add.name} changes the dtype of the sum")

    @staticmethod
    def _matched(m: MmRsMatch) -> list[torch.fx.Node]:
        terms = [n for t, reshape in m.terms for n in (t.node, reshape) if n is not None]
        return list(m.scatter.nodes) + terms + m.adds

    def epilogue_report(self, m: MmRsMatch):
        return None if m.capture is None else m.capture.single_output_report()

    def rewrite(self, m: MmRsMatch, lowering: str) -> None:
        rs, mm = m.scatter, m.matmul
        graph = rs.wait.graph
        out_shape = size_args(graph, val(rs.input).shape, rs.wait)
        cap = m.capture or ep.Capture()
        extra = cap.single_output_op_args()
        with graph.inserting_before(rs.wait):
            a, b = mm.a, mm.b
            if m.more:  # sum_i a_i @ b_i == cat(a_i, 1) @ cat(b_i, 0)
                a = call(graph, torch.ops.aten.cat.default, ([t.a for t, _ in m.terms], 1))
                b = call(graph, torch.ops.aten.cat.default, ([t.b for t, _ in m.terms], 0))
            fused = call(
                graph,
                torch.ops.overlap.mm_rs.default,
                (a, b, mm.bias, out_shape, rs.scatter_dim, rs.reduce_op, rs.group_name, lowering, *extra),
            )
        hoist_before(fused, list(cap.args))
        captured = ep.rewrite_after_collective(graph, fused, cap)
        rs.wait.replace_all_uses_with(fused)
        # The un-waited collective can also be an output (saved for backward): same value.
        rs.collective.replace_all_uses_with(fused, delete_user_cb=lambda user: user is not rs.wait)
        terms = [n for t, reshape in m.terms for n in (reshape, t.node) if n is not None]
        nodes = captured + list(reversed(rs.nodes)) + list(reversed(m.adds)) + terms
        erase_dead(list(dict.fromkeys(nodes)))  # a term may appear twice: add(mm, mm)
