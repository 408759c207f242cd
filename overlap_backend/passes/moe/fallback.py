"""transformers' float32 grouped GEMM backward, split so that the ``moe`` pass can take its input gradient.

``transformers::grouped_mm_fallback_backward(x, W, offs, g)`` computes a grouped GEMM's input gradient
``dX = g @ W[e]^T`` and weight gradient ``dW[e] = x^T g`` in one op, which the backward matcher cannot split.
In backward graphs with all-to-alls, each one becomes the two ops it computes::

    dX = transformers::grouped_mm_fallback(g, permute(W, [0, 2, 1]), offs)   # the forward's grouped GEMM form
    dW = overlap::grouped_mm_weight_grad(x, g, offs)

the same GEMMs per expert (the same loop over host-read offsets), so the graph computes what it did
whether or not the ``moe`` pass then rewrites the block.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from ...runtime.ops import OPS
from .region import FakeNodes

aten = torch.ops.aten
FALLBACK_BACKWARD = "transformers::grouped_mm_fallback_backward"


def _is_fallback_backward(n: torch.fx.Node) -> bool:
    return (n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
            and n.target._schema.name == FALLBACK_BACKWARD)


def split_fallback_backward(graph: torch.fx.Graph) -> list[str]:
    """Split every ``grouped_mm_fallback_backward`` read only through ``getitem`` (names of the split ops)."""
    import torch.distributed._functional_collectives  # noqa: F401 - registers _c10d_functional

    a2a = torch.ops._c10d_functional.all_to_all_single.default
    if not any(n.target is a2a for n in graph.nodes if n.op == "call_function"):
        return []
    done = []
    for n in [n for n in graph.nodes if _is_fallback_backward(n)]:
        users = list(n.users)
        if not users or any(u.target is not operator.getitem or u.args[1] not in (0, 1) for u in users):
            continue
        x, w, offs, g = n.args[:4]
        fake = FakeNodes(g)
        with graph.inserting_before(n):
            parts = {}
            if any(u.args[1] == 0 for u in users):
                wt = fake.call(graph, aten.permute.default, (w, [0, 2, 1]))
                parts[0] = fake.call(graph, torch.ops.transformers.grouped_mm_fallback.default, (g, wt, offs))
            if any(u.args[1] == 1 for u in users):
                parts[1] = fake.call(graph, OPS["grouped_mm_weight_grad"].default, (x, g, offs))
        for u in users:
            parts[u.args[1]].meta.update({k: v for k, v in u.meta.items() if k != "val"})
            u.replace_all_uses_with(parts[u.args[1]])
            graph.erase_node(u)
        done.append(n.name)
        graph.erase_node(n)
    return done


__all__ = ["split_fallback_backward"]
