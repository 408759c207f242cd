"""The ``p2p`` lowering of ``overlap::moe_experts``: per-destination chunking of the expert work.

The rows this rank received from source rank ``s`` must go back to ``s`` once the experts have
run on them, so the expert work is cut by source ("destination" of the combine):

- **dispatch**: ``ws - 1`` shift steps posted at once: step ``i`` sends ``x``'s chunk for rank
  ``r - i`` and receives the chunk of rank ``r + i``. Every rank posts them in the same order, so
  the pairing is deadlock-free on NCCL (one communication stream) and on gloo.
- **experts and combine**: for ``i = 1 … ws-1`` the rows of source ``r + i`` are computed as soon
  as their dispatch step has arrived (later steps are still in flight), then sent straight back
  (combine step ``i``: to ``r + i``, receiving this rank's results from ``r - i``) while the next
  source's rows are computed. The own rows come last: the last combine transfer overlaps them, and
  nothing but a wait follows the last GEMM.

Which grouped row belongs to which source and expert is worked out once per call (one host read of a
``[ws, E]`` count table; on CUDA that is one synchronisation). Within a chunk each expert's rows are
one GEMM each (``torch._grouped_mm`` for bfloat16 on CUDA with 16-byte-aligned rows, a loop of
``mm`` otherwise; the CUDA paths have not run yet: this version was written on a CPU-only machine).

On CUDA the transfers are issued from the high-priority communication stream of ``runtime/p2p.py``
(``streams.comm_stream``); the compute stream waits for a dispatch chunk only right before it reads
it. On gloo they are asynchronous work objects that progress while this thread computes. gloo
matches messages by tag: dispatch and combine use distinct tags.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from .lowering import register
from .ops import MOE_SAVED
from .p2p import Ring

_TAG_DISPATCH, _TAG_COMBINE = 0x40E1, 0x40E2


def _exchange(ring: Ring, tag: int, send: Tensor, to: int, recv: Tensor, frm: int) -> list[dist.Work]:
    """Start sending ``send`` to rank ``to`` and receiving ``recv`` from rank ``frm`` (empty rows: no message)."""
    ops = []
    if send.shape[0]:
        ops.append(dist.P2POp(dist.isend, send, group=ring.group, group_peer=to, tag=tag))
    if recv.shape[0]:
        ops.append(dist.P2POp(dist.irecv, recv, group=ring.group, group_peer=frm, tag=tag))
    return ring.start(ops)


def _prefix(sizes: list[int]) -> list[int]:
    out = [0]
    for s in sizes:
        out.append(out[-1] + int(s))
    return out


def _experts(xs: Tensor, counts: list[int], w_gate: Tensor, w_up: Tensor, w_down: Tensor):
    """SwiGLU of expert ``e`` on the ``counts[e]`` consecutive rows of ``xs`` that follow expert e-1's."""
    n, h, f = xs.shape[0], xs.shape[1], w_gate.shape[2]
    # _grouped_mm wants bfloat16 and 16-byte-aligned leading strides (rows of H and F elements).
    grouped = xs.is_cuda and xs.dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm") and h % 8 == 0 and f % 8 == 0
    if grouped:
        offs = torch.tensor(_prefix(counts)[1:], dtype=torch.int32, device=xs.device)
        g = torch._grouped_mm(xs, w_gate, offs=offs)
        u = torch._grouped_mm(xs, w_up, offs=offs)
        a = F.silu(g) * u
        return g, u, a, torch._grouped_mm(a, w_down, offs=offs)
    g, u = xs.new_empty((n, f)), xs.new_empty((n, f))
    y = xs.new_empty((n, w_down.shape[2]))
    start = 0
    for e, c in enumerate(counts):
        if c:
            rows = slice(start, start + c)
            torch.mm(xs[rows], w_gate[e], out=g[rows])
            torch.mm(xs[rows], w_up[e], out=u[rows])
        start += c
    a = F.silu(g) * u
    start = 0
    for e, c in enumerate(counts):
        if c:
            torch.mm(a[start : start + c], w_down[e], out=y[start : start + c])
        start += c
    return g, u, a, y


@register("p2p", "moe_experts")
def moe_experts(
    x: Tensor,
    send_splits: list[int],
    recv_splits: list[int],
    rows: Tensor,
    offsets: Tensor | None,
    group_sizes: list[int],
    w_gate: Tensor,
    w_up: Tensor,
    w_down: Tensor,
    group_name: str,
    saved: list[bool],
    comm_sms: int = -1,  # the symm lowering's communication SMs: nothing here runs a kernel of that kind
) -> tuple[Tensor, list[Tensor]]:
    # Inputs were validated by the op (runtime/checks.py), identically on every rank.
    ring = Ring(group_name, "moe_experts")
    ws, r = ring.size, ring.rank
    send_splits, recv_splits = [int(s) for s in send_splits], [int(s) for s in recv_splits]
    x = x.contiguous()
    experts, h, f = w_gate.shape
    cd, dev = w_gate.dtype, x.device
    send_off, recv_off = _prefix(send_splits), _prefix(recv_splits)

    # Dispatch: ws - 1 shift steps, all posted now (same order on every rank).
    recv = x.new_empty((recv_off[-1], h))
    recv[recv_off[r] : recv_off[r + 1]].copy_(x[send_off[r] : send_off[r + 1]])
    arrived: dict[int, list[dist.Work]] = {}
    for i in range(1, ws):
        dst, src = (r - i) % ws, (r + i) % ws
        arrived[src] = _exchange(ring, _TAG_DISPATCH, x[send_off[dst] : send_off[dst + 1]], dst,
                                 recv[recv_off[src] : recv_off[src + 1]], src)

    # Grouped row j: expert expert_of[j], source rank source[j]; sorted by (source, expert).
    m = rows.shape[0]
    rows = rows.to(device=dev, dtype=torch.long)
    if offsets is not None:
        ends = offsets.to(device=dev, dtype=torch.long)
    else:
        ends = torch.tensor(_prefix(group_sizes)[1:], dtype=torch.long, device=dev)
    j = torch.arange(m, device=dev)
    expert_of = torch.searchsorted(ends, j, right=True)
    source = torch.searchsorted(torch.tensor(recv_off[1:], dtype=torch.long, device=dev), rows, right=True)
    valid = (rows >= 0) & (expert_of < experts)
    key = torch.where(valid, source * experts + expert_of, ws * experts)
    key, order = torch.sort(key, stable=True)
    counts = torch.bincount(key, minlength=ws * experts + 1)[: ws * experts].view(ws, experts).tolist()
    starts = _prefix([sum(c) for c in counts])

    want = dict(zip(MOE_SAVED, saved))
    keep = {
        "xg": x.new_zeros((m, h), dtype=cd) if want["xg"] else None,
        "gate": x.new_zeros((m, f), dtype=cd) if want["gate"] else None,
        "up": x.new_zeros((m, f), dtype=cd) if want["up"] else None,
        "act": x.new_zeros((m, f), dtype=cd) if want["act"] else None,
    }
    y_recv = x.new_zeros((recv_off[-1], h))
    out = x.new_empty(x.shape)
    combine: list[dist.Work] = []

    def compute(src: int) -> None:
        js = order[starts[src] : starts[src + 1]]
        if js.numel() == 0:
            return
        src_rows = rows[js]
        xs = recv.index_select(0, src_rows).to(cd)
        g, u, a, y = _experts(xs, counts[src], w_gate, w_up, w_down)
        y_recv.index_copy_(0, src_rows, y.to(x.dtype))
        for name, value in (("xg", xs), ("gate", g), ("up", u), ("act", a)):
            if keep[name] is not None:
                keep[name].index_copy_(0, js, value)

    # Remote sources first: compute the rows of r + i, send them back while computing the next.
    for i in range(1, ws):
        src, dst = (r + i) % ws, (r - i) % ws
        ring.wait(arrived.pop(src), f"the dispatch of rank {src}'s rows")
        compute(src)
        combine.extend(_exchange(ring, _TAG_COMBINE, y_recv[recv_off[src] : recv_off[src + 1]], src,
                                 out[send_off[dst] : send_off[dst + 1]], dst))
    compute(r)  # own rows last: the last combine transfer overlaps them
    if keep["xg"] is not None:
        # Grouped rows past the last expert's end are gathered (Xg) but belong to no expert.
        idle = torch.nonzero((rows >= 0) & (expert_of >= experts)).view(-1)
        keep["xg"].index_copy_(0, idle, recv.index_select(0, rows[idle]).to(cd))
    out[send_off[r] : send_off[r + 1]].copy_(y_recv[recv_off[r] : recv_off[r + 1]])
    ring.wait(combine, "the combine (expert results going back)")

    values = []
    for name in MOE_SAVED:
        if name == "recv":
            values.append(recv if want["recv"] else x.new_empty((0,)))
        else:
            values.append(keep[name] if keep[name] is not None else x.new_empty((0,)))
    return out, values
