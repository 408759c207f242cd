"""The pass manager: ordered passes, each reporting what it matched, applied and rejected."""

from __future__ import annotations

import abc
import dataclasses
import logging
from dataclasses import asdict, dataclass, field
from collections.abc import Sequence
from typing import Any, ClassVar

import torch.fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from ..config import OverlapConfig
from ..cost import decision as cost_decision
from .collectives import forward_collective_copies
from .lowerings import lowering_candidates, written_lowering
from .rejected import Rejected
from .saved import record_forward
from .sizes import GUARDS_ALLOWED

log = logging.getLogger("overlap_backend")


@dataclass
class MatchRecord:
    """One pattern a pass saw: rewritten (``applied``) or left alone, with the reason."""

    pass_name: str
    applied: bool
    lowering: str | None
    nodes: list[str]
    reason: str
    # rewritten ops with an epilogue decision: per op output, what was captured and why the
    # capture stopped (passes/epilogue.py); None for passes that capture none
    epilogue: list[dict[str, Any]] | None = None
    # the cost model's prediction for a match that passed the preconditions (cost/model.py);
    # None for a match rejected before it could be priced
    cost: dict[str, Any] | None = None
    # ag_mm: the row-wise ops moved from after the gather onto the shard (passes/prologue.py)
    prologue: dict[str, Any] | None = None
    # a pattern split over graphs: the graph breaks that split it, each with what the user can set
    # (graph_breaks.py)
    graph_break: list[dict[str, Any]] | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["pass"] = d.pop("pass_name")
        for key in ("epilogue", "cost", "prologue", "graph_break"):
            if d[key] is None:
                del d[key]
        return d


@dataclass
class PassContext:
    config: OverlapConfig
    graph_kind: str  # "forward" | "backward" | "inference"
    # passes that run only because the cost model may turn them on (not named by the user): they
    # look only where the model is active and rewrite only where it predicts a win
    model_gated: frozenset[str] = frozenset()
    # the graph will be replayed from a CUDA graph (Inductor's cudagraphs, mode="reduce-overhead"):
    # the host time of a call is paid once at capture, not per step (the cost model drops it)
    cuda_graphs: bool = False
    # ... in Inductor's graph partitions: what Inductor cannot capture (a data-dependent size, a CPU
    # op) runs between captured partitions, so a match is captured unless its own values are such
    partitioned: bool = False

    def captured(self, nodes: Sequence[torch.fx.Node] = ()) -> bool:
        """Is a match over ``nodes`` replayed from a CUDA graph?"""
        if not self.cuda_graphs:
            return False
        return not (self.partitioned and any(_data_dependent(n) for n in nodes if n is not None))


def _data_dependent(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    return val is not None and bool(free_unbacked_symbols(val))


class OverlapPass(abc.ABC):
    """A rewrite pass. ``find`` only looks, ``check`` only judges, ``rewrite`` only rewrites."""

    name: ClassVar[str]

    def __init__(self, ctx: PassContext):
        self.ctx = ctx
        self.cost: dict[str, Any] | None = None  # set by ``decide`` during ``check``

    @property
    def gated(self) -> bool:
        """This pass runs only where the cost model turns it on (see ``PassContext.model_gated``)."""
        return self.name in self.ctx.model_gated

    def decide(self, problem: Any, group_name: str, device_type: str, lowering: str, *, symm_runs: bool = True,
               nodes: Sequence[torch.fx.Node] = (), **op_knobs: Any) -> cost_decision.Decision:
        """The end of every ``check``: the cost model's decision for a match that passed the
        preconditions. ``lowering``: the pass's own choice (what runs where the model is not active),
        priced with the other candidates (``lowering_candidates``; ``symm_runs=False``: the op's symm
        kernels would not run here). :class:`Rejected` with the model's reason where it keeps the match
        plain; else the :class:`~overlap_backend.cost.decision.Decision` whose ``lowering`` is the one
        to write (an explicit ``OVERLAP_LOWERING`` as given, else the model's pick) and whose knobs
        (``stages``, ``comm_sms``) the op takes. The prediction goes into the match's record.
        ``nodes``: the match's values whose sizes decide whether it is captured (``PassContext.captured``);
        ``op_knobs``: the config's values of the op's knobs (``stages``, ``comm_sms``: ``"auto"`` lets the
        model pick)."""
        candidates = lowering_candidates(self.ctx, lowering, symm_runs)
        decision = cost_decision.decide(self.ctx, problem, group_name, device_type, candidates, gated=self.gated,
                                        captured=self.ctx.captured(nodes), **op_knobs)
        self.cost = decision.cost
        if not decision.rewrite:
            raise Rejected(decision.reason)
        return dataclasses.replace(decision, lowering=written_lowering(self.ctx, lowering, decision))

    @abc.abstractmethod
    def find(self, graph: torch.fx.Graph) -> list[Any]:
        """All candidate matches in ``graph``, without changing it."""

    @abc.abstractmethod
    def check(self, match: Any) -> str:
        """Raise :class:`Rejected` if ``match`` must be left alone; else return the lowering."""

    @abc.abstractmethod
    def rewrite(self, match: Any, lowering: str) -> None:
        """Replace ``match`` by one ``torch.ops.overlap`` op."""

    @abc.abstractmethod
    def describe(self, match: Any) -> list[str]:
        """Names of the matched nodes, for the report."""

    @abc.abstractmethod
    def key(self, match: Any) -> torch.fx.Node:
        """The node that identifies ``match`` across re-finds (its collective)."""

    def epilogue_report(self, match: Any) -> list[dict[str, Any]] | None:
        """What ``match``'s op captured after its GEMM, per output (passes with epilogues)."""
        return None

    def prologue_report(self, match: Any) -> dict[str, Any] | None:
        """What ``match``'s rewrite moved before its collective (``ag_mm``)."""
        return None

    def run(self, graph: torch.fx.Graph) -> list[MatchRecord]:
        records = []
        seen: set[torch.fx.Node] = set()
        while True:
            # Find again after every rewrite: a rewrite erases nodes that a later match (a chain
            # such as all_reduce(all_reduce(x @ w1) @ w2)) would otherwise still hold.
            match = next((m for m in self.find(graph) if self.key(m) not in seen), None)
            if match is None:
                break
            seen.add(self.key(match))
            nodes = self.describe(match)
            self.cost = None
            try:
                lowering = self.check(match)
            except Rejected as e:
                records.append(MatchRecord(self.name, False, None, nodes, str(e), cost=self.cost))
                continue
            self.rewrite(match, lowering)
            graph.lint()
            records.append(MatchRecord(self.name, True, lowering, nodes, "rewritten", self.epilogue_report(match),
                                       cost=self.cost, prologue=self.prologue_report(match)))
        return records


@dataclass
class GraphReport:
    id: str
    kind: str
    matches: list[MatchRecord] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "matches": [m.to_json() for m in self.matches]}


class PassManager:
    """Runs the configured passes in order on one graph; calls ``observer`` around each pass."""

    def __init__(self, passes: list[type[OverlapPass]], model_gated: frozenset[str] = frozenset()):
        self.passes = passes
        self.model_gated = model_gated

    def run(self, graph: torch.fx.Graph, ctx: PassContext, report: GraphReport, observer=None) -> None:
        if self.model_gated and not ctx.model_gated:
            ctx = dataclasses.replace(ctx, model_gated=self.model_gated)
        token = GUARDS_ALLOWED.set(ctx.graph_kind != "backward")
        try:
            self._run(graph, ctx, report, observer)
        finally:
            GUARDS_ALLOWED.reset(token)

    def _run(self, graph, ctx, report, observer) -> None:
        if ctx.graph_kind == "forward":  # its saved values' facts, for the backward's passes
            record_forward(graph)
        if observer is not None:
            observer.before(graph)
        if self.passes and forward_collective_copies(graph) and observer is not None:
            observer.after_pass("normalize", graph)
        for pass_cls in self.passes:
            records = pass_cls(ctx).run(graph)
            report.matches.extend(records)
            for rec in records:
                log.info(
                    "%s graph %s: %s %s (%s)",
                    pass_cls.name, report.id, "applied" if rec.applied else "rejected", rec.nodes, rec.reason,
                )
            # a model-gated pass that found nothing (the model is not active here) leaves no trace
            if observer is not None and (records or pass_cls.name not in ctx.model_gated):
                observer.after_pass(pass_cls.name, graph)


__all__ = ["GraphReport", "MatchRecord", "OverlapPass", "PassContext", "PassManager", "Rejected"]
