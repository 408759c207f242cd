"""Node access and graph surgery shared by the passes: values, arguments, ancestors, new nodes with
fake values, erasing and hoisting."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

aten = torch.ops.aten
c10d = torch.ops._c10d_functional

RESHAPES = (aten.reshape.default, aten.view.default, aten._unsafe_view.default)
SPLITS = (aten.split.Tensor, aten.split.sizes, aten.split_with_sizes.default)


def val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def arg(node: torch.fx.Node, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


# ----------------------------------------------------------------------------- preconditions
def ancestors(node: torch.fx.Node) -> set[torch.fx.Node]:
    seen: set[torch.fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        for inp in n.all_input_nodes:
            if inp not in seen:
                seen.add(inp)
                stack.append(inp)
    return seen


def dtype_name(node: torch.fx.Node) -> str:
    return str(val(node).dtype).removeprefix("torch.")


def device_type(node: torch.fx.Node) -> str:
    v = val(node)
    return v.device.type if isinstance(v, torch.Tensor) else "cpu"


# ---------------------------------------------------------------------------- node surgery
def set_fake_value(node: torch.fx.Node) -> None:
    """Fill ``node.meta['val']`` by running its target on the inputs' fake values."""
    from torch._guards import detect_fake_mode

    vals = [val(n) for n in node.all_input_nodes]
    fake_mode = detect_fake_mode(vals)
    if fake_mode is None or any(v is None for v in vals):
        return

    def to_val(a):
        return val(a) if isinstance(a, torch.fx.Node) else a

    args = torch.fx.node.map_aggregate(node.args, to_val)
    kwargs = torch.fx.node.map_aggregate(node.kwargs, to_val)
    with fake_mode:
        node.meta["val"] = node.target(*args, **kwargs)


def call(graph: torch.fx.Graph, target, args, kwargs=None) -> torch.fx.Node:
    node = graph.call_function(target, tuple(args), kwargs or {})
    set_fake_value(node)
    return node


def erase_dead(nodes: list[torch.fx.Node]) -> None:
    """Erase the nodes of a replaced match that nothing uses any more (users before inputs); never a
    placeholder (the compiled graph's signature stays)."""
    changed = True
    pending = [n for n in nodes if n.graph is not None and n.op != "placeholder"]
    while changed:
        changed = False
        for n in list(pending):
            if len(n.users) == 0:
                n.graph.erase_node(n)
                pending.remove(n)
                changed = True


def hoist_before(anchor: torch.fx.Node, roots: list[torch.fx.Node]) -> None:
    """Move the ancestors of ``roots`` that come after ``anchor`` to just before it, in order.

    Only valid when none of them depends on a node at or after ``anchor`` that is not moved; the
    passes check that the weights do not depend on the collective before calling this.
    """
    graph = anchor.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    late = {n for r in roots for n in (ancestors(r) | {r}) if order[n] > order[anchor] and n.op != "placeholder"}
    for n in sorted(late, key=order.__getitem__):
        anchor.prepend(n)
