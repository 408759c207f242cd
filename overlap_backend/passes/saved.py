"""What a forward graph knows about the values it saves for its backward.

AOTAutograd hands the backward its saved values as placeholders: a zero-filled buffer the forward
saved (the min-cut partitioner saves a fill it can share, e.g. the padded expert input's zero base,
instead of recomputing it) is just an input there. The backward placeholder's ``meta["val"]`` is the
very fake tensor of the forward's output node, so the forward records its facts under that object
(:func:`record_forward`) and the backward reads them back (:func:`fact`).
"""

from __future__ import annotations

import weakref

import torch
import torch.fx

aten = torch.ops.aten
ZEROS = "zeros"

_facts: dict[int, tuple[weakref.ref, str]] = {}  # id(fake value) -> (the value, its fact)


def _zero_fill(n: torch.fx.Node) -> bool:
    if n.op != "call_function":
        return False
    if n.target in (aten.zeros.default, aten.new_zeros.default):
        return True
    if n.target is aten.full.default:
        return n.args[1] == 0
    return n.target is aten.new_full.default and n.args[2] == 0


def record_forward(graph: torch.fx.Graph) -> None:
    """Remember which of a forward graph's outputs (its saved values) are zero fills."""
    for key, (ref, _) in list(_facts.items()):
        if ref() is None:
            del _facts[key]
    for n in graph.output_node().all_input_nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor) and _zero_fill(n):
            _facts[id(val)] = (weakref.ref(val), ZEROS)


def fact(n: torch.fx.Node) -> str | None:
    """What the forward recorded about the saved value behind the backward placeholder ``n``, or None."""
    if not isinstance(n, torch.fx.Node) or n.op != "placeholder":
        return None
    val = n.meta.get("val")
    entry = _facts.get(id(val))
    return entry[1] if entry is not None and entry[0]() is val else None


def saved_zeros(n: torch.fx.Node) -> bool:
    """Is ``n`` a backward input that the forward saved as a zero fill?"""
    return fact(n) == ZEROS


__all__ = ["ZEROS", "fact", "record_forward", "saved_zeros"]
