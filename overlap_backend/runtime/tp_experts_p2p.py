"""The ``p2p`` lowering of ``moe_tp_experts`` / ``moe_tp_experts_backward``: token bands.

The output ``[T, N]`` is cut into ``knobs.tp_experts.BANDS`` bands of consecutive tokens. For band
``b`` the op gathers the expert rows of its tokens (forward: the rows ``slot_rows`` points at from
the band's top-k slots; backward: the rows whose ``tokens`` entry lies in the band), groups them by
expert, runs one GEMM per expert (``torch._grouped_mm`` for bfloat16 on CUDA with aligned rows),
reduces them into the band's tokens (forward: routing weight and top-k sum; backward: scatter-add)
and starts the band's all-reduce (``async_op``), then computes band ``b + 1`` while it travels. The
weight gradient of the backward runs after the last band's all-reduce was started. Every band's
all-reduce is waited on before the op returns; an exception in a band waits on those already started
first (``p2p.Ring``), so no rank leaves a collective posted that its peers would wait on forever.

Cutting by tokens keeps the communicated bytes at ``T x N`` (a reduce-scatter of the ``T * top_k``
expert rows would move ``top_k`` times more) and is exact: each token's sum is formed from the same
rows, in the same order, as the plain graph forms it. The price is one gather of the band's rows
and one host read of its per-expert counts (a synchronisation on CUDA), per band.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from ..spec import knobs
from .lowering import register
from .moe_p2p import expert_matmul
from .p2p import Ring

_DIST_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT,
             "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


def band_edges(tokens: int) -> list[int]:
    """Token boundaries of the bands: ``BANDS`` bands of equal size (the first ones one larger), each
    of at least ``MIN_BAND_TOKENS`` tokens; at least one band."""
    k = knobs.tp_experts
    bands = max(1, min(int(k.BANDS), tokens // max(1, int(k.MIN_BAND_TOKENS)) or 1))
    size, extra = divmod(tokens, bands)
    edges = [0]
    for b in range(bands):
        edges.append(edges[-1] + size + (b < extra))
    return edges


def rows_gemm(a: Tensor, w: Tensor, rows: Tensor, offsets: Tensor | None, expert_ids: Tensor | None) -> Tensor:
    """``a[rows[i]] @ w[e(rows[i])]`` for each ``i`` (0 for a row past ``offsets[-1]``), in ``rows``' order."""
    experts = w.shape[0]
    if offsets is not None:
        eid = torch.bucketize(rows, offsets.to(rows.dtype), right=True)  # e with offsets[e-1] <= j < offsets[e]
    else:
        eid = expert_ids[rows]
    eid_sorted, order = torch.sort(eid, stable=True)
    counts = torch.bincount(eid_sorted, minlength=experts + 1)[:experts].tolist()  # the band's one host read
    grouped = rows[order]
    computed = sum(counts)
    out = a.new_zeros((rows.shape[0], w.shape[2]))
    if computed:
        out[order[:computed]] = expert_matmul(a[grouped[:computed]], counts, w)
    return out


def _start(ring: Ring, band: Tensor, reduce_op: str) -> list[dist.Work]:
    if band.is_cuda:
        ring._cuda = True
    work = dist.all_reduce(band, op=_DIST_OPS[reduce_op], group=ring.group, async_op=True)
    ring.pending.append(work)
    return [work]


def _finish(ring: Ring, works: list[list[dist.Work]], out: Tensor, reduce_op: str) -> Tensor:
    for b, w in enumerate(works):
        ring.wait(w, f"the all-reduce of token band {b}")
    if reduce_op == "avg":
        out.div_(ring.size)
    return out


@register("p2p", "moe_tp_experts")
def moe_tp_experts(a, w, offsets, expert_ids, row_mask, scale, slot_rows, top_k, reduce_op, group_name, return_rows):
    slots = a.shape[0] if slot_rows is None else slot_rows.shape[0]
    tokens, n = slots // top_k, w.shape[2]
    dtype = a.dtype if scale is None else torch.promote_types(a.dtype, scale.dtype)
    out = torch.empty((tokens, n), dtype=dtype, device=a.device)
    rows_out = a.new_zeros((a.shape[0], n)) if return_rows else a.new_empty((0,))
    mask = None if row_mask is None else row_mask.reshape(-1)
    weight = None if scale is None else scale.reshape(-1)
    with Ring(group_name, "moe_tp_experts") as ring:  # an exception waits on the started all-reduces first
        edges, works = band_edges(tokens), []
        for lo, hi in zip(edges[:-1], edges[1:]):
            if slot_rows is None:
                rows = torch.arange(lo * top_k, hi * top_k, device=a.device)
            else:
                rows = slot_rows[lo * top_k: hi * top_k]
            y = rows_gemm(a, w, rows, offsets, expert_ids)
            if mask is not None:
                y = y.masked_fill(mask[rows].unsqueeze(-1), 0)
            if return_rows:
                rows_out[rows] = y
            if weight is not None:
                y = y * weight[rows].unsqueeze(-1)
            band = out[lo:hi]
            torch.sum(y.view(hi - lo, top_k, n), 1, out=band)
            works.append(_start(ring, band, reduce_op))
        return _finish(ring, works, out, reduce_op), rows_out


@register("p2p", "moe_tp_experts_backward")
def moe_tp_experts_backward(g, w, offsets, expert_ids, row_mask, tokens, num_tokens, x, reduce_op, group_name):
    n = w.shape[2]
    dx = torch.zeros((num_tokens, n), dtype=g.dtype, device=g.device)
    mask = None if row_mask is None else row_mask.reshape(-1)
    with Ring(group_name, "moe_tp_experts_backward") as ring:
        edges = band_edges(num_tokens)
        # rows by token (stable: a token's rows keep their order), and where each band's rows start
        order = torch.argsort(tokens, stable=True)
        starts = torch.searchsorted(tokens[order], torch.tensor(edges, device=tokens.device)).tolist()
        works = []
        for b, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
            rows = order[starts[b]: starts[b + 1]]
            d = rows_gemm(g, w, rows, offsets, expert_ids)
            if mask is not None:
                d = d.masked_fill(mask[rows].unsqueeze(-1), 0)
            band = dx[lo:hi]
            band.index_put_((tokens[rows] - lo,), d, accumulate=True)
            works.append(_start(ring, band, reduce_op))
        dw = g.new_empty((0,)) if x is None else weight_grad(x, g, offsets, w.shape[0])  # while the last band travels
        return _finish(ring, works, dx, reduce_op), dw


def weight_grad(x: Tensor, g: Tensor, offsets: Tensor, experts: int) -> Tensor:
    """``dw[e] = x[rows of e].T @ g[rows of e]`` (``[E, x cols, g cols]``; experts without rows: 0)."""
    dw = x.new_zeros((experts, x.shape[1], g.shape[1]))
    start = 0
    for e, end in enumerate(offsets.tolist()):
        end = min(int(end), x.shape[0])
        if end > start:
            torch.mm(x[start:end].T, g[start:end], out=dw[e])
        start = max(start, end)
    return dw
