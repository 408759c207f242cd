"""Pass ``mm_rs``: matmul → (reshape) → reduce-scatter  ⇒  ``torch.ops.overlap.mm_rs``.

Matches every reduce-scatter (dim 0, or split/cat and slice/cat forms for other dims) whose input
is an ``mm``/``addmm``, directly or through one reshape (``mm → reshape`` of 3-D activations), and
whose matmul result feeds nothing else. With ``fuse_epilogues`` the pointwise chain after the
reduce-scatter (a residual add of the matching row chunk, scaling, a cast, ...) goes into the op's
``epilogue`` (``passes/epilogue.py``): it runs on the reduced chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.fx

from . import common, cost_model
from . import epilogue as ep
from .common import Matmul, Rejected
from .manager import OverlapPass


@dataclass
class MmRsMatch:
    scatter: common.ReduceScatter
    matmul: Matmul | None
    reshape: torch.fx.Node | None
    capture: ep.Capture | None = None  # the chain after the wait that the op computes (set by check)


class MmRsPass(OverlapPass):
    name = "mm_rs"

    def find(self, graph):
        return [MmRsMatch(rs, *common.producer_matmul(rs.input)) for rs in common.find_reduce_scatters(graph)]

    def key(self, m):
        return m.scatter.collective

    def describe(self, m: MmRsMatch):
        pre = ([m.matmul.node] if m.matmul else []) + ([m.reshape] if m.reshape is not None else [])
        return [n.name for n in pre + m.scatter.nodes]

    def check(self, m: MmRsMatch) -> str:
        rs, mm = m.scatter, m.matmul
        if mm is None:
            raise Rejected(f"the reduce-scattered tensor {rs.input.name} is not produced by a matmul"
                           + (f": {why}" if (why := common.crosses_graph_break(rs.input, upstream=True)) else ""))
        ws = common.require_group(rs.group_name, rs.group_size)
        if rs.reduce_op not in common.REDUCE_OPS:
            raise Rejected(f"reduce op {rs.reduce_op!r} not supported")
        if err := common.scatter_layout_error(rs, ws):
            raise Rejected(err)
        common.require_backed(mm.a, mm.b, rs.input)
        out_shape, mm_shape = common.val(rs.input).shape, common.val(mm.node).shape
        if not (common.known_eq(out_shape[-1], mm_shape[1]) and common.known_eq(common.prod(out_shape[:-1]), mm_shape[0])):
            raise Rejected(f"reshape {tuple(mm_shape)} -> {tuple(out_shape)} does not keep the matmul's rows and columns")
        common.require_dtype(mm.a, mm.b)
        common.require_bias_vector(mm)
        produced = [mm.node] + ([m.reshape] if m.reshape is not None else [])
        for node in produced:
            others = [u for u in node.users if u not in rs.nodes and u not in produced]
            if others:
                raise Rejected(f"{node.name} is also used by {[u.name for u in others]}")
        out_shape = common.val(rs.input).shape
        # guard (where not known symbolically): the scattered dim splits into ws equal chunks
        if not common.decide(out_shape[rs.scatter_dim % len(out_shape)] % ws == 0):
            raise Rejected(f"scatter dim of {tuple(out_shape)} not divisible by {ws}")
        common.require_sizes_available(rs.wait.graph, out_shape, rs.wait)
        common.require_min_numel(self.ctx, common.prod(out_shape))
        lowering = common.choose_lowering(self.ctx, rs.group_name)
        m.capture = ep.capture_after_collective(self.ctx, rs.wait, rs.collective, self._matched(m),
                                                tuple(common.val(rs.wait).shape), common.val(rs.wait).dtype)
        hint = common.hint
        problem = cost_model.Problem("mm_rs", m=hint(mm_shape[0]), n=hint(mm_shape[1]),
                                     k=hint(common.val(mm.a).shape[1]), dtype=common.dtype_name(mm.a), ws=ws)
        decision = self.price(problem, rs.group_name, common.device_type(mm.a),
                              common.lowering_candidates(self.ctx, lowering))
        return common.written_lowering(self.ctx, lowering, decision)

    @staticmethod
    def _matched(m: MmRsMatch) -> list[torch.fx.Node]:
        return list(m.scatter.nodes) + [m.matmul.node] + ([m.reshape] if m.reshape is not None else [])

    def epilogue_report(self, m: MmRsMatch):
        if m.capture is None:
            return None
        return [{"output": 0, "spec": m.capture.spec({a: i for i, a in enumerate(m.capture.args)}), **m.capture.report()}]

    def rewrite(self, m: MmRsMatch, lowering: str) -> None:
        rs, mm = m.scatter, m.matmul
        graph = rs.wait.graph
        out_shape = common.size_args(graph, common.val(rs.input).shape, rs.wait)
        cap = m.capture or ep.Capture()
        extra = (cap.spec({a: i for i, a in enumerate(cap.args)}), list(cap.args)) if cap.steps else ()
        with graph.inserting_before(rs.wait):
            fused = common.call(
                graph,
                torch.ops.overlap.mm_rs.default,
                (mm.a, mm.b, mm.bias, out_shape, rs.scatter_dim, rs.reduce_op, rs.group_name, lowering, *extra),
            )
        common.hoist_before(fused, list(cap.args))
        captured = ep.rewrite_after_collective(graph, fused, cap)
        rs.wait.replace_all_uses_with(fused)
        # The un-waited collective can also be an output (saved for backward): same value.
        rs.collective.replace_all_uses_with(fused, delete_user_cb=lambda user: user is not rs.wait)
        nodes = captured + list(reversed(rs.nodes)) + ([m.reshape] if m.reshape is not None else []) + [mm.node]
        common.erase_dead(nodes)
