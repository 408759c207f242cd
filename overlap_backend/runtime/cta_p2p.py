"""The ``p2p`` lowering of ``overlap::cta_pipeline_mlp``: a stage pipeline over P2P.

This is the portable fallback of CTA-pipelining (docs/cta.md), not the CTA-level schedule itself
(that is the ``symm`` lowering, ``runtime/cta_symm.py``). The rows of ``x`` are cut into ``stages``
micro-chunks (fewer when ``x`` has fewer rows). Each chunk is reduced with the fused ring
reduce-scatter of ``runtime/p2p.py`` (``reduce_scatter_matmul``, as ``mm_ar`` does): its rows are
cut into ``ws`` sub-chunks, and the MLP of sub-chunk ``c`` (``act(x_c @ w1) @ w2``) is computed while the
accumulator of the previous sub-chunk travels the ring, this rank's own sub-chunk last. The reduced
sub-chunk is then all-gathered asynchronously while the next micro-chunk is computed, so only the
last chunk's all-gather follows the last GEMM.

The result is the op's exact semantics (``runtime/ops.py``) up to the order of the sum over ranks
(ring order instead of the collective's): chunking the rows changes neither a row's GEMMs nor its
activation, and every rank runs the same chunks in the same order.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from .lowering import register
from .p2p import Ring, reduce_scatter_matmul


def linear(a: Tensor, w: Tensor, bias: Tensor | None, out: Tensor | None = None) -> Tensor:
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
    # Inputs were validated by the op (runtime/checks.py), identically on every rank.
    with Ring(group_name, "cta_pipeline_mlp") as ring:  # an exception in a step waits on its transfers first
        ws = ring.size
        m, n = x.shape[0], w2.shape[1]
        dtype = torch.result_type(x, w1)
        out = x.new_empty((m, n), dtype=dtype)
        if m == 0:
            return out

        def mlp(rows: Tensor) -> Tensor:
            h = linear(rows, w1, b1)
            if activation == "gelu":
                a = F.gelu(h, approximate=approximate)
            else:
                a = F.silu(h) * linear(rows, w3, b3)
            return linear(a, w2, b2).to(dtype)

        pending: list[tuple[dist.Work, Tensor, int, int]] = []
        for lo, hi in chunk_bounds(m, stages):
            rows = hi - lo
            step = -(-rows // ws)  # sub-chunks of equal length; the last ones are zero-padded

            def partial(c: int, lo=lo, hi=hi, step=step) -> Tensor:
                s_lo, s_hi = min(lo + c * step, hi), min(lo + (c + 1) * step, hi)
                res = mlp(x[s_lo:s_hi])
                if s_hi - s_lo < step:
                    res = torch.cat([res, res.new_zeros((step - (s_hi - s_lo), n))])
                return res

            mine = reduce_scatter_matmul(ring, partial, (step, n), dtype, x.device, "sum")
            full = torch.empty((ws * step, n), dtype=dtype, device=x.device)
            # Gather this chunk while the next one is computed.
            work = ring.all_gather(full, mine)
            pending.append((work, full, lo, hi))
        for i, (work, full, lo, hi) in enumerate(pending):
            ring.wait([work], f"the all-gather of micro-chunk {i}")
            out[lo:hi].copy_(full[: hi - lo])
        return out
