"""Pass ``mm_ar``: matmul → (reshape) → all-reduce  ⇒  ``torch.ops.overlap.mm_ar`` (→ reshape).

The row-parallel projection of inference tensor parallelism: ``mm``/``addmm`` whose result (or its
reshape to N-D) is all-reduced and feeds nothing else. With ``fuse_epilogues`` the pointwise chain
after the all-reduce (residual add, bias, scaling, a cast, ...) goes into the op's ``epilogue``
(``passes/epilogue.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx

from ..cost import Problem
from . import epilogue as ep
from . import lowerings
from .collectives import AllReduce, find_all_reduces
from .fx import call, device_type, dtype_name, erase_dead, hoist_before, val
from .manager import OverlapPass
from .matmuls import Matmul, producer_matmul
from .preconditions import (REDUCE_OPS, crosses_graph_break, require_backed, require_bias_vector, require_dtype,
                            require_group, require_min_numel)
from .rejected import Rejected
from .sizes import decide, hint, prod, require_sizes_available, size_args


@dataclass
class MmArMatch:
    reduce: AllReduce
    matmul: Matmul | None
    reshape: torch.fx.Node | None
    capture: ep.Capture | None = None  # the chain after the wait that the op computes (set by check)


class MmArPass(OverlapPass):
    name = "mm_ar"

    def find(self, graph):
        return [MmArMatch(ar, *producer_matmul(ar.input)) for ar in find_all_reduces(graph)]

    def key(self, m):
        return m.reduce.collective

    def describe(self, m: MmArMatch):
        pre = ([m.matmul.node] if m.matmul else []) + ([m.reshape] if m.reshape is not None else [])
        return [n.name for n in pre + m.reduce.nodes]

    def check(self, m: MmArMatch) -> str:
        ar, mm = m.reduce, m.matmul
        if mm is None:
            raise Rejected(f"the all-reduced tensor {ar.input.name} is not produced by a matmul"
                           + (f": {why}" if (why := crosses_graph_break(ar.input, upstream=True)) else ""))
        ws = require_group(ar.group_name)
        if ar.reduce_op not in REDUCE_OPS:
            raise Rejected(f"reduce op {ar.reduce_op!r} not supported")
        require_backed(mm.a, mm.b, ar.input)
        require_dtype(mm.a, mm.b)
        require_bias_vector(mm)
        produced = [mm.node] + ([m.reshape] if m.reshape is not None else [])
        for node in produced:
            others = [u for u in node.users if u not in ar.nodes and u not in produced]
            if others:
                raise Rejected(f"{node.name} is also used by {[u.name for u in others]}")
        out = val(mm.node)
        # guard (where not known symbolically): at least one row per rank
        if not decide(out.shape[0] >= ws):
            raise Rejected(f"{out.shape[0]} rows < {ws} ranks: too few rows to split")
        if m.reshape is not None:
            require_sizes_available(ar.wait.graph, val(m.reshape).shape, ar.wait)
        require_min_numel(self.ctx, prod(out.shape))
        lowering = lowerings.choose_lowering(self.ctx, ar.group_name, device_type(ar.wait))
        matched = list(ar.nodes) + [mm.node] + ([m.reshape] if m.reshape is not None else [])
        m.capture = ep.capture_after_collective(self.ctx, ar.wait, ar.collective, matched, tuple(out.shape),
                                                val(ar.wait).dtype)
        problem = Problem("mm_ar", m=hint(out.shape[0]), n=hint(out.shape[1]), k=hint(val(mm.a).shape[1]),
                          dtype=dtype_name(mm.a), ws=ws)
        return self.decide(problem, ar.group_name, device_type(mm.a), lowering).lowering

    def epilogue_report(self, m: MmArMatch):
        return None if m.capture is None else m.capture.single_output_report()

    def rewrite(self, m: MmArMatch, lowering: str) -> None:
        ar, mm = m.reduce, m.matmul
        graph = ar.wait.graph
        cap = m.capture or ep.Capture()
        extra = cap.single_output_op_args()
        with graph.inserting_before(ar.wait):
            op = call(
                graph, torch.ops.overlap.mm_ar.default,
                (mm.a, mm.b, mm.bias, ar.reduce_op, ar.group_name, lowering, *extra),
            )
            result = op
            if m.reshape is not None:
                shape = size_args(graph, val(m.reshape).shape, ar.wait)
                result = call(graph, torch.ops.aten.reshape.default, (op, shape))
        hoist_before(op, list(cap.args))
        captured = ep.rewrite_after_collective(graph, op, cap)
        ar.wait.replace_all_uses_with(result)
        ar.collective.replace_all_uses_with(result, delete_user_cb=lambda user: user is not ar.wait)
        nodes = captured + list(reversed(ar.nodes)) + ([m.reshape] if m.reshape is not None else []) + [mm.node]
        erase_dead(nodes)
