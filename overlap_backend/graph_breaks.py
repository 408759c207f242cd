"""Graph breaks that split a pattern over graphs, and what the user can set to avoid them.

Dynamo counts every graph break it takes (``torch._dynamo.utils.counters["graph_break"]``, keyed by its message)
before it compiles the graph the break ends. :class:`GraphBreakTracker` reads the breaks counted since the previous
compile (or, where none were, the last ones counted: the graphs of a resumed frame follow them); where a forward or
inference graph holds an ``all_to_all_single`` that no ``moe`` match took (its dispatch or its combine partner is
in another graph), the backend reports a ``moe`` match left alone whose ``graph_break`` entry lists those breaks,
each with Dynamo's explanation and what the user can set (:func:`advice`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from .passes import MatchRecord

# (a piece of Dynamo's message, what the user can set); every rule that matches applies
_RULES = (
    ("_local_scalar_dense", "torch._dynamo.config.capture_scalar_outputs = True: .item() / .tolist() become unbacked "
                            "SymInts in the graph instead of ending it"),
    ("dynamic shape operator", "torch._dynamo.config.capture_dynamic_output_shape_ops = True: ops whose output size "
                               "depends on the data (nonzero, repeat_interleave without output_size) stay in the graph"),
    ("Data-dependent branching", "no setting: Python branches on a tensor's value; write the block without the branch "
                                 "(static shapes, torch.cond) or keep it out of the compiled region"),
    ("data dependent", "a data-dependent size reached a Python condition: torch._check(...) the facts the compiler "
                       "cannot infer, or torch._dynamo.decorators.mark_unbacked on the input whose size varies"),
    ("GenericContextWrappingVariable", "no setting: the break happened inside a context manager Dynamo cannot split "
                                       "(the frames around it run eagerly); removing the break inside it removes this "
                                       "one"),
)
# the all-to-all expert parallelism of Hugging Face transformers: its static-shape replacement
TRANSFORMERS_EP = ("transformers' expert parallelism: overlap_backend.models.hf.register_ep_implementation(), then "
                   "DistributedConfig(ep_implementation=\"overlap_all_to_all\") (static-shape all-to-alls: one graph, "
                   "rewritten by the moe pass)")


def summarize(message: str) -> dict[str, Any]:
    """Dynamo's graph-break message as ``{"reason", "explanation", "hints"}`` (its first line, its explanation and
    its hints; a break taken while handling another one names both in ``reason``)."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    reasons = [lines[0]] if lines else []
    follows = "*** While handling this graph break, another graph break occurred: ***"
    for i, ln in enumerate(lines[:-1]):
        if ln == follows:
            reasons.append(lines[i + 1])
    explanation = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Explanation:")), "")
    hints = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Hint:")]
    return {"reason": " -> ".join(reasons), "explanation": explanation, "hints": hints}


def advice(message: str, transformers_ep: bool = False) -> list[str]:
    """What the user can set so that the break in ``message`` does not happen."""
    out = [fix for piece, fix in _RULES if piece in message]
    if transformers_ep:
        out.append(TRANSFORMERS_EP)
    return out


class GraphBreakTracker:
    """The graph breaks Dynamo counted since the last :meth:`take` (one per Dynamo graph compile)."""

    def __init__(self) -> None:
        from torch._dynamo.utils import counters

        self._seen: Counter = Counter(counters["graph_break"])  # (breaks before this backend existed are not its)
        self.recent: dict[str, int] = {}  # the last non-empty take: the breaks behind the graphs compiled since

    def take(self) -> dict[str, int]:
        from torch._dynamo.utils import counters

        now = Counter(counters["graph_break"])
        # a count below the one seen: the counters were cleared since (all of it is new)
        new = {msg: n - self._seen[msg] if n >= self._seen[msg] else n for msg, n in now.items() if n != self._seen[msg]}
        self._seen = now
        if new:
            self.recent = new
        return new


def _all_to_alls(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    target = torch.ops._c10d_functional.all_to_all_single.default
    return [n for n in graph.nodes if n.op == "call_function" and n.target is target]


def from_transformers_ep(node: torch.fx.Node) -> bool:
    trace = node.meta.get("stack_trace") or ""
    return "transformers/distributed/expert_parallel.py" in trace or "transformers/integrations" in trace


def split_pattern_records(graph: torch.fx.Graph, breaks: dict[str, int], records: list[MatchRecord]) -> list[MatchRecord]:
    """``moe`` records for the all-to-alls of ``graph`` (before the passes ran) that no ``moe`` rewrite took,
    when the graph was compiled after the graph breaks ``breaks``: the pattern is split over graphs."""
    if not breaks:
        return []
    taken = {n for r in records if r.pass_name == "moe" for n in r.nodes}
    lone = [n for n in _all_to_alls(graph) if n.name not in taken]
    if not lone:
        return []
    hf = any(from_transformers_ep(n) for n in lone)
    entries = [{**summarize(msg), "count": count, "set": advice(msg, hf)} for msg, count in breaks.items()]
    reason = ("the all-to-all's dispatch or combine partner is in another graph: graph breaks split the MoE block ("
              + "; ".join(e["reason"] for e in entries) + "); see graph_break for what to set")
    return [MatchRecord("moe", False, None, [n.name for n in lone], reason, graph_break=entries)]


__all__ = ["GraphBreakTracker", "TRANSFORMERS_EP", "advice", "split_pattern_records", "summarize"]
