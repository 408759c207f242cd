"""The ``p2p`` lowering of ``overlap::cta_pipeline_mlp``: a micro-chunk pipeline over the group.

This is the portable fallback of CTA-pipelining (issue 5), not the CTA-level schedule itself (that
is the ``symm`` lowering, not written yet). It is the simpler all-reduce-based version: the rows of
``x`` are cut into ``stages`` micro-chunks (fewer when ``x`` has fewer rows); for each chunk this
rank computes ``act(x_c @ w1) @ w2`` into its rows of the output and starts an asynchronous
``all_reduce`` (sum) of those rows, then computes the next chunk while that reduction is in flight.
Only the reduction of the last chunk follows the last GEMM. On CUDA the collective runs on the
process group's own stream and ``Work.wait`` makes the compute stream wait (the host does not block);
on gloo the reductions progress in gloo's threads while this thread computes.

The result is the op's exact semantics (``runtime/ops.py``): chunking the rows changes neither a
row's GEMMs nor its activation, and every rank reduces the same rows in the same chunk order.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.distributed.distributed_c10d import _resolve_process_group

from .lowering import register
from .ops import CTA_ACTIVATIONS, GELU_APPROXIMATIONS


def _linear(a: Tensor, w: Tensor, bias: Tensor | None, out: Tensor | None = None) -> Tensor:
    if bias is None:
        return torch.mm(a, w, out=out)
    return torch.addmm(bias, a, w, out=out)


def chunk_bounds(m: int, stages: int) -> list[tuple[int, int]]:
    """``stages`` row ranges covering ``[0, m)`` as evenly as possible (none empty unless m == 0)."""
    n = max(1, min(stages, m))
    base, extra = divmod(m, n)
    bounds, lo = [], 0
    for i in range(n):
        hi = lo + base + (1 if i < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


@register("p2p", "cta_pipeline_mlp")
def cta_pipeline_mlp(
    x: Tensor,
    w1: Tensor,
    b1: Tensor | None,
    w3: Tensor | None,
    b3: Tensor | None,
    w2: Tensor,
    b2: Tensor | None,
    activation: str,
    approximate: str,
    stages: int,
    group_name: str,
) -> Tensor:
    if activation not in CTA_ACTIVATIONS:
        raise ValueError(f"overlap p2p cta_pipeline_mlp: activation {activation!r}; allowed: {', '.join(CTA_ACTIVATIONS)}")
    if approximate not in GELU_APPROXIMATIONS:
        raise ValueError(f"overlap p2p cta_pipeline_mlp: approximate {approximate!r}; allowed: none, tanh")
    if (activation == "swiglu") != (w3 is not None):
        raise ValueError("overlap p2p cta_pipeline_mlp: w3 is given exactly when activation is 'swiglu'")
    if stages < 1:
        raise ValueError(f"overlap p2p cta_pipeline_mlp: stages={stages}; allowed: an integer >= 1")
    for name, t in (("x", x), ("w1", w1), ("w2", w2)):
        if t.dim() != 2:
            raise ValueError(f"overlap p2p cta_pipeline_mlp: {name} must be 2-D, got shape {tuple(t.shape)}")
    group = _resolve_process_group(group_name)
    m, n = x.shape[0], w2.shape[1]
    out = x.new_empty((m, n), dtype=torch.result_type(x, w1))

    works: list[dist.Work] = []
    for lo, hi in chunk_bounds(m, stages):
        xc = x[lo:hi]
        h = _linear(xc, w1, b1)
        if activation == "gelu":
            a = F.gelu(h, approximate=approximate)
        else:
            a = F.silu(h) * _linear(xc, w3, b3)
        rows = out[lo:hi]  # a contiguous row block of out
        _linear(a, w2, b2, out=rows)
        # Reduce this chunk while the next one is computed.
        works.append(dist.all_reduce(rows, op=dist.ReduceOp.SUM, group=group, async_op=True))
    for w in works:
        w.wait()
    return out
