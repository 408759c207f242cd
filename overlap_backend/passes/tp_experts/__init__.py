"""Pass ``moe_tp_experts``: tensor-parallel experts' GEMM -> all-reduce => ``overlap::moe_tp_experts(_backward)``.

Tensor-parallel experts (transformers' ``moe_tp_experts`` plan, and ``AllReduceEP``, which masks the
other ranks' experts and all-reduces the same way) give every rank an F-slice of every expert; the
experts' output is the all-reduce of partial down-projection rows, weighted per row, un-permuted
and summed over each token's top-k slots (forward), and the experts' input gradient is the
all-reduce of a grouped GEMM's rows scatter-added into their tokens (backward). ``mm_ar`` cannot take
either: the all-reduced tensor is no matmul. This pass replaces each by one op whose semantics are
exactly the matched subgraph (``runtime/tp_experts.py``) and whose ``p2p`` lowering cuts the tokens
into bands, each band's all-reduce travelling while the next band's expert GEMMs run
(``runtime/tp_experts_p2p.py``; docs/moe.md). ``match`` finds the candidates (only looks); ``check``
judges and ``rewrite`` rewrites here.

It runs before ``mm_ar``, so an experts' all-reduce it rewrites is not also reported as refused there.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from ...cost import Problem
from .. import lowerings
from ..collectives import find_all_reduces
from ..fx import ancestors, call, device_type, dtype_name, erase_dead, hoist_before, val
from ..manager import OverlapPass
from ..preconditions import require_backed, require_dtype, require_group
from ..rejected import Rejected
from ..sizes import hint
from .match import TpExpertsMatch, is_inverse_permutation, match_backward, match_forward

TP_REDUCE_OPS = ("sum", "avg", "product", "min", "max")  # runtime/tp_experts.py's


class TpExpertsPass(OverlapPass):
    name = "moe_tp_experts"

    def find(self, graph):
        found = []
        for ar in find_all_reduces(graph):
            m = match_forward(ar) or match_backward(ar)
            if m is not None:
                found.append(m)
        return found

    def key(self, m: TpExpertsMatch):
        return m.reduce.collective

    def describe(self, m: TpExpertsMatch):
        gemm = m.gemm.nodes if m.gemm else []
        return [n.name for n in list(reversed(gemm)) + list(reversed(m.chain)) + m.reduce.nodes]

    def _inputs(self, m: TpExpertsMatch) -> list[torch.fx.Node]:
        g = m.gemm
        nodes = [g.a, g.w, g.w_source, g.offsets, g.expert_ids, g.x, m.mask, m.scale, m.slot_rows, m.tokens]
        return [n for n in nodes if isinstance(n, torch.fx.Node)]

    def check(self, m: TpExpertsMatch) -> str:
        ar, g = m.reduce, m.gemm
        if m.error is not None:
            raise Rejected(f"tensor-parallel experts' all-reduce of {ar.input.name}: {m.error}")
        ws = require_group(ar.group_name)
        if ar.reduce_op not in TP_REDUCE_OPS:
            raise Rejected(f"reduce op {ar.reduce_op!r} not supported")
        weight = g.w if g.w is not None else g.w_source
        require_backed(g.a, weight, ar.input)
        require_dtype(g.a, weight, *([g.x] if g.x is not None else []))
        if m.scale is not None and not val(m.scale).is_floating_point():
            raise Rejected(f"the routing weights {m.scale.name} are not floating point")
        # every matched value but the last before the routing weight is read by the match only
        rows_readers = []
        inner = m.chain + g.nodes
        for node in m.chain + g.nodes[:2]:
            if node is g.weight_grad:
                continue  # the weight gradient: the op computes it too
            others = [u for u in node.users if u not in inner and u not in ar.nodes]
            if node is m.rows and not m.backward:
                rows_readers = others
            elif node is g.bmm and others and m.rows is g.node:
                m.bmm_readers = others  # read as unsqueeze(rows, -1)
            elif others:
                raise Rejected(f"{node.name} is also used by {[u.name for u in others]}")
        if m.bmm_readers:
            rows_readers = rows_readers + [u for u in m.bmm_readers if u not in rows_readers]
        if rows_readers and m.slot_rows is not None and not is_inverse_permutation(m.slot_rows, val(g.a).shape[0]):
            raise Rejected(f"{m.rows.name} is also read by {[u.name for u in rows_readers]} and the un-permutation "
                           f"{m.slot_rows.name} is not recognisably a permutation of its rows")
        m.rows_readers = rows_readers
        late = set(m.chain) | set(g.nodes)
        for inp in self._inputs(m):
            if late & (ancestors(inp) | {inp}):
                raise Rejected(f"{inp.name} depends on the matched GEMM's output")
        lowering = lowerings.choose_lowering(self.ctx, ar.group_name, device_type(ar.wait))
        out, rows = val(ar.input), val(g.a)
        k_eff = hint(rows.shape[1]) * max(1, hint(rows.shape[0]) // max(1, hint(out.shape[0])))
        # priced as the all-reduce of [T, N] after a GEMM of the same FLOPs (T x K*top_k x N)
        problem = Problem("mm_ar", m=hint(out.shape[0]), n=hint(out.shape[1]), k=k_eff, dtype=dtype_name(g.a), ws=ws)
        return self.decide(problem, ar.group_name, device_type(g.a), lowering).lowering

    def rewrite(self, m: TpExpertsMatch, lowering: str) -> None:
        ar, g = m.reduce, m.gemm
        graph = ar.wait.graph
        order = {n: i for i, n in enumerate(graph.nodes)}
        late_readers = list(m.rows_readers) + (list(g.weight_grad.users) if g.weight_grad else [])
        anchor = min([ar.input, *late_readers], key=order.__getitem__)
        with graph.inserting_before(anchor):
            w = g.w
            if w is None:
                w = call(graph, torch.ops.aten.permute.default, (g.w_source, list(g.w_perm)))
            if m.backward:
                op = call(graph, torch.ops.overlap.moe_tp_experts_backward.default,
                          (g.a, w, g.offsets, g.expert_ids, m.mask, m.tokens, m.num_tokens, g.x, ar.reduce_op,
                           ar.group_name, lowering))
            else:
                op = call(graph, torch.ops.overlap.moe_tp_experts.default,
                          (g.a, w, g.offsets, g.expert_ids, m.mask, m.scale, m.slot_rows, m.top_k, ar.reduce_op,
                           ar.group_name, lowering, bool(m.rows_readers)))
            out = call(graph, operator.getitem, (op, 0))
            second = call(graph, operator.getitem, (op, 1))
        hoist_before(w if g.w is None else op, self._inputs(m))
        ar.wait.replace_all_uses_with(out)
        ar.collective.replace_all_uses_with(out, delete_user_cb=lambda user: user is not ar.wait)
        if m.backward and g.weight_grad is not None:
            g.weight_grad.replace_all_uses_with(second)
        elif not m.backward and m.rows_readers:
            inner = set(m.chain) | set(g.nodes)
            m.rows.replace_all_uses_with(second, delete_user_cb=lambda user: user not in inner)
            if m.bmm_readers:
                with graph.inserting_after(second):
                    column = call(graph, torch.ops.aten.unsqueeze.default, (second, -1))
                g.bmm.replace_all_uses_with(column, delete_user_cb=lambda user: user not in inner)
        erase_dead(list(reversed(ar.nodes)) + m.chain + g.nodes + m.extra + [second])
