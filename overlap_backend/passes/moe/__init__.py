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
for backward) are taken from the op's ``saved`` outputs (``forward.py``). Backward graphs hold the
same all-to-all pair around the experts' input gradients: in all three forms they become one
``overlap.moe_experts_backward``, the weight gradients staying in the graph (``backward.py``).

One module per job: ``structure`` (what a match is), ``match`` / ``match_backward`` (only look:
``find_moe``), ``layout`` (the proof that the row moves undo each other), ``region`` (what both
directions share: the region between the all-to-alls, the decision), ``forward`` / ``backward`` (each
direction's checks and rewrite); :class:`MoePass` ties them together.
"""

from __future__ import annotations

from ..manager import OverlapPass
from ..preconditions import require_group
from ..rejected import Rejected
from . import backward, forward
from .fallback import split_fallback_backward
from .layout import layout_error
from .match import find_all_to_alls, find_moe
from .region import same_splits
from .structure import AllToAll, Experts, ExpertGrads, MoeMatch, Step


class MoePass(OverlapPass):
    name = "moe"

    def find(self, graph):
        if self.ctx.graph_kind == "backward":  # transformers' float32 grouped GEMM backward: dX and dW apart
            split_fallback_backward(graph)
        return find_moe(graph)

    def key(self, m: MoeMatch):
        return m.combine.collective

    def describe(self, m: MoeMatch):
        nodes = []
        if m.dispatch is not None:
            nodes += [m.dispatch.collective, m.dispatch.wait]
        if m.experts is not None:
            e = m.experts
            nodes += [n for group in (e.fused, e.gate, e.up, e.down) for n in group]
        if m.grads is not None:
            nodes += m.grads.gemms
        nodes += [m.combine.collective, m.combine.wait]
        return [n.name for n in nodes]

    def check(self, m: MoeMatch) -> str:
        if m.failure is not None:
            raise Rejected(self._reason(m.failure))
        d, c = m.dispatch, m.combine
        if d.group_name != c.group_name:
            raise Rejected(f"dispatch and combine run on different groups {d.group_name!r}, {c.group_name!r}")
        ws = require_group(c.group_name)
        for name, splits in (("dispatch", d.output_splits), ("dispatch", d.input_splits)):
            if len(splits) != ws:
                raise Rejected(f"the {name} has {len(splits)} splits for a group of {ws} ranks")
        if not (same_splits(c.output_splits, d.input_splits) and same_splits(c.input_splits, d.output_splits)):
            raise Rejected("the combine's split sizes are not the dispatch's, swapped")
        if m.grads is not None:
            return backward.check(self, m, ws)
        return forward.check(self, m, ws)

    def rewrite(self, m: MoeMatch, lowering: str) -> None:
        if m.grads is not None:
            backward.rewrite(m, lowering)
        else:
            forward.rewrite(m, lowering)

    def _reason(self, why: str) -> str:
        if self.ctx.graph_kind == "backward":
            return f"backward graph: {why}"
        return why


__all__ = ["AllToAll", "ExpertGrads", "Experts", "MoeMatch", "MoePass", "Step", "find_all_to_alls", "find_moe",
           "layout_error"]
