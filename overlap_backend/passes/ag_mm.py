"""Pass ``ag_mm``: all-gather → (reshape) → matmul(s)  ⇒  ``torch.ops.overlap.ag_mm``.

Matches every all-gather (dim 0, or split/cat and slice/cat forms for other dims) whose gathered
value is the left operand of one or more ``mm``/``addmm`` (directly, or through a reshape that
flattens the leading dims: the ``reshape → mm → reshape`` form of 3-D activations). All those
matmuls, e.g. Q, K and V projections, become one op that gathers step by step.

Where row-wise ops sit between the gather and the matmuls (``all_gather → rms_norm / layer_norm /
cast → mm``), the rewrite first moves them onto the shard (``passes/prologue.py``), which makes the
gather overlappable at all and runs them on 1/ws of the rows.

With ``fuse_epilogues`` each matmul's output also takes the pointwise chain after it into the op's
``epilogue`` (``passes/epilogue.py``): a bias add, GELU, SiLU, ``silu(out_i) * out_j`` of two of
its matmuls (SwiGLU), scaling, a residual add, a cast.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass

import torch
import torch.fx

from . import common, cost_model
from . import epilogue as ep
from . import prologue as pro
from ..spec import epilogue as spec_mod
from .common import Matmul, Rejected
from .manager import OverlapPass


@dataclass
class AgMmMatch:
    gather: common.AllGather
    matmuls: list[Matmul]
    # reshape nodes between the gathered value and a matmul (erased when dead)
    flatten_nodes: list[torch.fx.Node]
    # per matmul: the pointwise chain after it that the op computes (set by ``check``)
    captures: list[ep.Capture] | None = None
    # row-wise ops between the gather and the matmuls, moved onto the shard by ``rewrite``
    prologue: pro.Prologue | None = None
    # why no prologue was found where no matmul reads the gathered value directly
    no_prologue: str = ""

    @property
    def operand(self) -> torch.fx.Node:
        """The value the matmuls read (the gathered one, or the prologue's end)."""
        return self.prologue.end if self.prologue is not None else self.gather.result


def find_consumer_matmuls(result: torch.fx.Node) -> tuple[list[Matmul], list[torch.fx.Node]]:
    """Matmuls whose left operand is ``result`` or its flatten to 2-D."""
    matmuls, flattens = [], []
    for user in result.users:
        if (mm := common.as_matmul(user)) is not None and mm.a is result:
            matmuls.append(mm)
        elif common.is_flatten_to_2d(user):
            found = [mm for u in user.users if (mm := common.as_matmul(u)) is not None and mm.a is user]
            if found:
                matmuls.extend(found)
                flattens.append(user)
    return matmuls, flattens


def _prologue_consumers_error(prologue: pro.Prologue, matmuls: list[Matmul], flattens: list[torch.fx.Node]) -> str:
    """Why the matmuls after ``prologue`` cannot take it ("" if they can)."""
    end = prologue.end
    if not matmuls:
        (reader, why), *_ = prologue.end_readers
        return f"no matmul reads {end.name}, the end of the row-wise ops; {reader.name} does: {why}"
    if prologue.folded:  # the op gathers the value without them: no reader but the matmuls may see it
        mm_nodes = {mm.node for mm in matmuls}
        others = [u for u in end.users if u not in mm_nodes and u not in flattens]
        others += [u for f in flattens for u in f.users if u not in mm_nodes]
        if others:
            folded = " and ".join(n.name for n in prologue.folded)
            return (f"{end.name} is also read by {', '.join(u.name for u in others)}, and its per-column "
                    f"{folded} can only be folded into the matmuls")
    return ""


class AgMmPass(OverlapPass):
    name = "ag_mm"

    def find(self, graph):
        matches = []
        for ag in common.find_all_gathers(graph):
            matmuls, flattens = find_consumer_matmuls(ag.result)
            prologue, why = None, ""
            if not matmuls:
                prologue, why = pro.walk(ag)
                if prologue is not None:
                    matmuls, flattens = find_consumer_matmuls(prologue.end)
                    why = _prologue_consumers_error(prologue, matmuls, flattens)
                    if why:
                        prologue, matmuls, flattens = None, [], []
            matches.append(AgMmMatch(ag, matmuls, flattens, prologue=prologue, no_prologue=why))
        return matches

    def key(self, m):
        return m.gather.collective

    def describe(self, m: AgMmMatch):
        moved = m.prologue.nodes if m.prologue is not None else []
        return [n.name for n in m.gather.nodes + moved] + [mm.node.name for mm in m.matmuls]

    def check(self, m: AgMmMatch) -> str:
        ag = m.gather
        # the group first: on one rank there is nothing to overlap, whatever reads the gathered tensor
        ws = common.require_group(ag.group_name, ag.group_size)
        if not m.matmuls:
            why = "no matmul takes the gathered tensor as its left operand"
            if m.no_prologue:
                raise Rejected(f"{why}, and the row-wise ops after it cannot move before the gather: {m.no_prologue}")
            raise Rejected(common.crosses_graph_break(ag.result, upstream=False) or why)
        common.require_backed(ag.shard, ag.result, m.operand, *[mm.b for mm in m.matmuls])
        # the op gathers the operand's dtype (a cast in the prologue moves before the gather)
        common.require_dtype(m.operand, *[mm.b for mm in m.matmuls])
        shard = common.val(ag.shard)
        if not -shard.dim() <= ag.gather_dim < shard.dim():
            raise Rejected(f"gather dim {ag.gather_dim} out of range for shard of rank {shard.dim()}")
        if err := common.gather_layout_error(ag, ws):
            raise Rejected(err)
        gathered = ag.result
        for mm in m.matmuls:
            if gathered in common.ancestors(mm.b) or (mm.bias is not None and gathered in common.ancestors(mm.bias)):
                raise Rejected(f"{mm.node.name}: the weight operand depends on the gathered tensor")
            if common.val(mm.b).dim() != 2:
                raise Rejected(f"{mm.node.name}: weight is not 2-D")
            common.require_bias_vector(mm)
        common.require_min_numel(self.ctx, *[common.val(mm.node).numel() for mm in m.matmuls])
        lowering = common.choose_lowering(self.ctx, ag.group_name, common.device_type(ag.shard))
        m.captures = self._captures(m)
        hint = common.hint
        problem = cost_model.Problem(
            "ag_mm", m=hint(common.val(m.matmuls[0].node).shape[0]), k=hint(common.val(m.matmuls[0].b).shape[0]),
            n=sum(hint(common.val(mm.b).shape[1]) for mm in m.matmuls), dtype=common.dtype_name(m.operand), ws=ws,
            gemms=len(m.matmuls), **(pro.cost_terms(m.prologue, m.matmuls) if m.prologue is not None else {}),
        )
        decision = self.price(problem, ag.group_name, common.device_type(ag.shard),
                              common.lowering_candidates(self.ctx, lowering))
        return common.written_lowering(self.ctx, lowering, decision)

    def _captures(self, m: AgMmMatch) -> list[ep.Capture]:
        """Each matmul's epilogue chain; ``swiglu`` may read a matmul whose own chain is empty."""
        ag = m.gather
        forbidden = set(ag.nodes) | {ag.result} | {mm.node for mm in m.matmuls} | set(m.flatten_nodes)
        if m.prologue is not None:
            forbidden |= set(m.prologue.nodes)
        partners = {}
        for j, mm in enumerate(m.matmuls):
            partners[mm.node] = j
            partners.update({u: j for u in mm.node.users if u.target in common.RESHAPES})
        caps = [ep.walk(mm.node, forbidden, partners, self.ctx.config.fuse_epilogues) for mm in m.matmuls]
        for i, cap in enumerate(caps):
            for j in cap.partners:
                if caps[j].steps or caps[j].partners:
                    caps[i] = ep.Capture(stop=f"swiglu reads {m.matmuls[j].node.name}, which has an epilogue itself")
        # the spec must describe the op's outputs (a walk that went wrong is no reason to fail)
        specs, args = self._specs(caps)
        rows = common.val(m.matmuls[0].node).shape[0]
        try:
            spec_mod.check(specs, [common.val(a) for a in args], [(rows, common.val(mm.node).shape[1]) for mm in m.matmuls],
                           [common.val(mm.node).dtype for mm in m.matmuls], allow_out_refs=True)
        except spec_mod.EpilogueError as e:
            caps = [ep.Capture(stop=f"epilogue not captured: {e}") for _ in caps]
        order = {n: i for i, n in enumerate(ag.result.graph.nodes)}
        first_user = min(m.operand.users, key=order.__getitem__)  # where rewrite inserts the op
        if any(why := ep.end_sizes_error(cap, first_user) for cap in caps):
            caps = [ep.Capture(stop=why) for _ in caps]
        return caps

    @staticmethod
    def _specs(caps: list[ep.Capture]) -> tuple[list[str], list[torch.fx.Node]]:
        args = list(dict.fromkeys(a for cap in caps for a in cap.args))
        index = {a: i for i, a in enumerate(args)}
        return [cap.spec(index) for cap in caps], args

    def epilogue_report(self, m: AgMmMatch):
        if m.captures is None:
            return None
        specs, _ = self._specs(m.captures)
        return [{"output": i, "spec": spec, **cap.report()} for i, (spec, cap) in enumerate(zip(specs, m.captures))]

    def prologue_report(self, m: AgMmMatch):
        return m.prologue.report() if m.prologue is not None else None

    def rewrite(self, m: AgMmMatch, lowering: str) -> None:
        if m.prologue is not None:  # the gather now reads the prologue's end, computed on the shard
            m.gather = dataclasses.replace(m.gather, shard=pro.hoist(m.gather, m.prologue))
        ag = m.gather
        graph = ag.result.graph
        order = {n: i for i, n in enumerate(graph.nodes)}
        first_user = min(ag.result.users, key=order.__getitem__)
        weights = [mm.b for mm in m.matmuls]
        biases = [mm.bias for mm in m.matmuls]
        caps = m.captures or [ep.Capture() for _ in m.matmuls]
        specs, ep_args = self._specs(caps)
        extra = ("|".join(specs), ep_args) if any(specs) else ()
        if m.prologue is not None:
            weights, biases = pro.fold(first_user, weights, biases, m.prologue)
        with graph.inserting_before(first_user):
            fused = common.call(
                graph,
                torch.ops.overlap.ag_mm.default,
                (ag.shard, weights, biases, ag.gather_dim, ag.group_name, lowering, True, *extra),
            )
            gathered = common.call(graph, operator.getitem, (fused, 0))
            outs = common.call(graph, operator.getitem, (fused, 1))
            out_nodes = [common.call(graph, operator.getitem, (outs, i)) for i in range(len(m.matmuls))]
            ends = [ep.result_node(graph, out, cap) for out, cap in zip(out_nodes, caps)]
        common.hoist_before(fused, [n for n in weights + biases + ep_args if n is not None])
        # swiglu's other operand: a reshape of a matmul that only the captured chain read
        partner_values = [u for mm in m.matmuls for u in mm.node.users if u.target in common.RESHAPES]
        captured = []
        for cap, end in zip(caps, ends):
            if cap.end is not None:
                cap.end.replace_all_uses_with(end)
                captured += reversed(cap.nodes)
        for mm, out in zip(m.matmuls, out_nodes):
            mm.node.replace_all_uses_with(out)
        ag.result.replace_all_uses_with(gathered)
        common.erase_dead(list(dict.fromkeys(captured + partner_values + [mm.node for mm in m.matmuls]
                                             + m.flatten_nodes + list(reversed(ag.nodes)))))
        if not gathered.users:
            # Nothing else reads the gathered tensor: the op need not assemble it.
            graph.erase_node(gathered)
            fused.update_arg(6, False)
            common.set_fake_value(fused)
