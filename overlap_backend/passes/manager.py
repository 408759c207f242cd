"""The pass manager: ordered passes, each reporting what it matched, applied and rejected."""

from __future__ import annotations

import abc
import logging
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import torch.fx

from ..config import OverlapConfig

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

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["pass"] = d.pop("pass_name")
        if d["epilogue"] is None:
            del d["epilogue"]
        return d


@dataclass
class PassContext:
    config: OverlapConfig
    graph_kind: str  # "forward" | "backward" | "inference"


class Rejected(Exception):
    """Raised by a pass's ``check`` with the reason a match is left alone."""


class OverlapPass(abc.ABC):
    """A rewrite pass. ``find`` only looks, ``check`` only judges, ``rewrite`` only rewrites."""

    name: ClassVar[str]

    def __init__(self, ctx: PassContext):
        self.ctx = ctx

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
            try:
                lowering = self.check(match)
            except Rejected as e:
                records.append(MatchRecord(self.name, False, None, nodes, str(e)))
                continue
            self.rewrite(match, lowering)
            graph.lint()
            records.append(MatchRecord(self.name, True, lowering, nodes, "rewritten", self.epilogue_report(match)))
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

    def __init__(self, passes: list[type[OverlapPass]]):
        self.passes = passes

    def run(self, graph: torch.fx.Graph, ctx: PassContext, report: GraphReport, observer=None) -> None:
        from .common import GUARDS_ALLOWED, forward_collective_copies

        token = GUARDS_ALLOWED.set(ctx.graph_kind != "backward")
        try:
            self._run(graph, ctx, report, observer, forward_collective_copies)
        finally:
            GUARDS_ALLOWED.reset(token)

    def _run(self, graph, ctx, report, observer, forward_collective_copies) -> None:
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
            if observer is not None:
                observer.after_pass(pass_cls.name, graph)
