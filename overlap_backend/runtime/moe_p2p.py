"""The ``p2p`` lowerings of ``overlap::moe_experts`` and ``moe_experts_backward``: per-destination
chunking of the expert work.

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

``moe_experts_backward`` runs the same schedule on the backward graph's pair of all-to-alls: the
result gradients travel like the dispatch, the input gradients of each source's rows go back like
the combine while the next source's are computed (``_pipeline``, shared).

Which grouped row belongs to which source and expert is worked out once per call (one host read of a
``[ws, E]`` count table; on CUDA that is one synchronisation). Within a chunk each expert's rows are
one GEMM each (``torch._grouped_mm`` for bfloat16 on CUDA with 16-byte-aligned rows, a loop of
``mm`` otherwise).

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


def prefix_sums(sizes: list[int]) -> list[int]:
    out = [0]
    for s in sizes:
        out.append(out[-1] + int(s))
    return out


def expert_matmul(a: Tensor, counts: list[int], w: Tensor) -> Tensor:
    """``a``'s rows of expert ``e`` (``counts[e]`` consecutive rows after expert e-1's) @ ``w[e]``
    (``w`` may be any strided view: it is read in place)."""
    n, k, f = a.shape[0], a.shape[1], w.shape[2]
    # _grouped_mm wants bfloat16 and 16-byte-aligned leading strides (rows of K and F elements), and
    # takes ``w`` as a view (a half of a fused gate/up weight) where it is row- or column-major per expert
    strided_ok = (w.stride(-1) == 1 or w.stride(-2) == 1) and w.data_ptr() % 16 == 0
    if (a.is_cuda and a.dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm") and k % 8 == 0 and f % 8 == 0
            and strided_ok):
        offs = torch.tensor(prefix_sums(counts)[1:], dtype=torch.int32, device=a.device)
        return torch._grouped_mm(a.contiguous(), w, offs=offs)
    out = a.new_empty((n, f))
    start = 0
    for e, c in enumerate(counts):
        if c:
            torch.mm(a[start : start + c], w[e], out=out[start : start + c])
        start += c
    return out


def _experts(xs: Tensor, counts: list[int], w_gate: Tensor, w_up: Tensor, w_down: Tensor):
    """SwiGLU of expert ``e`` on the ``counts[e]`` consecutive rows of ``xs`` that follow expert e-1's."""
    g = expert_matmul(xs, counts, w_gate)
    u = expert_matmul(xs, counts, w_up)
    a = F.silu(g) * u
    return g, u, a, expert_matmul(a, counts, w_down)


def _expert_grads(dy: Tensor, g: Tensor, u: Tensor, counts: list[int], wt_gate: Tensor, wt_up: Tensor,
                  wt_down: Tensor):
    """The backward of ``_experts`` on the same rows: ``(dX, dG, dU)`` from the result gradient ``dy``."""
    da = expert_matmul(dy, counts, wt_down).float()
    g32 = g.float()
    s = torch.sigmoid(g32)
    du = (da * (g32 * s)).to(g.dtype)
    dg = (da * u.float() * s * (1 + g32 * (1 - s))).to(g.dtype)
    return expert_matmul(dg, counts, wt_gate) + expert_matmul(du, counts, wt_up), dg, du


class _Plan:
    """Which grouped row belongs to which source rank and expert: grouped row ``j`` is received row
    ``rows[j]`` of expert ``expert_of[j]`` (``ends`` from ``offsets`` or ``group_sizes``); ``order``
    sorts the valid ones by (source, expert), ``counts[s][e]`` rows each, source ``s``'s from
    ``order[starts[s]]`` on. One host read of the count table (on CUDA a synchronisation)."""

    def __init__(self, ws, send_splits, recv_splits, rows, offsets, group_sizes, experts, dev):
        self.send_off, self.recv_off = prefix_sums(send_splits), prefix_sums(recv_splits)
        self.m, self.experts = rows.shape[0], experts
        self.rows = rows.to(device=dev, dtype=torch.long)
        if offsets is not None:
            ends = offsets.to(device=dev, dtype=torch.long)
        else:
            ends = torch.tensor(prefix_sums(group_sizes)[1:], dtype=torch.long, device=dev)
        j = torch.arange(self.m, device=dev)
        self.expert_of = torch.searchsorted(ends, j, right=True)
        source = torch.searchsorted(torch.tensor(self.recv_off[1:], dtype=torch.long, device=dev), self.rows,
                                    right=True)
        valid = (self.rows >= 0) & (self.expert_of < experts)
        key = torch.where(valid, source * experts + self.expert_of, ws * experts)
        key, self.order = torch.sort(key, stable=True)
        self.counts = torch.bincount(key, minlength=ws * experts + 1)[: ws * experts].view(ws, experts).tolist()
        self.starts = prefix_sums([sum(c) for c in self.counts])

    def grouped(self, src: int) -> Tensor:
        """The grouped rows of source ``src``, sorted by expert."""
        return self.order[self.starts[src] : self.starts[src + 1]]

    def idle(self) -> Tensor:
        """Grouped rows that hold a received row but belong to no expert (past the last expert's end)."""
        return torch.nonzero((self.rows >= 0) & (self.expert_of >= self.experts)).view(-1)


def _pipeline(ring: Ring, x: Tensor, plan: _Plan, compute) -> tuple[Tensor, Tensor]:
    """Dispatch ``x`` (send order), run ``compute(src, recv, result)`` for the rows of each source as
    they arrive (own rows last), each source's ``result`` rows (received order) sent straight back.
    Returns ``(recv, out)``: the received rows and the results in ``x``'s order."""
    ws, r = ring.size, ring.rank
    send_off, recv_off = plan.send_off, plan.recv_off
    # Dispatch: ws - 1 shift steps, all posted now (same order on every rank).
    recv = x.new_empty((recv_off[-1], x.shape[1]))
    recv[recv_off[r] : recv_off[r + 1]].copy_(x[send_off[r] : send_off[r + 1]])
    arrived: dict[int, list[dist.Work]] = {}
    for i in range(1, ws):
        dst, src = (r - i) % ws, (r + i) % ws
        arrived[src] = _exchange(ring, _TAG_DISPATCH, x[send_off[dst] : send_off[dst + 1]], dst,
                                 recv[recv_off[src] : recv_off[src + 1]], src)
    result = x.new_zeros((recv_off[-1], x.shape[1]))
    out = x.new_empty(x.shape)
    combine: list[dist.Work] = []
    # Remote sources first: compute the rows of r + i, send them back while computing the next.
    for i in range(1, ws):
        src, dst = (r + i) % ws, (r - i) % ws
        ring.wait(arrived.pop(src), f"the dispatch of rank {src}'s rows")
        compute(src, recv, result)
        combine.extend(_exchange(ring, _TAG_COMBINE, result[recv_off[src] : recv_off[src + 1]], src,
                                 out[send_off[dst] : send_off[dst + 1]], dst))
    compute(r, recv, result)  # own rows last: the last combine transfer overlaps them
    out[send_off[r] : send_off[r + 1]].copy_(result[recv_off[r] : recv_off[r + 1]])
    ring.wait(combine, "the combine (expert results going back)")
    return recv, out


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
    with Ring(group_name, "moe_experts") as ring:  # an exception in a step waits on its transfers first
        x = x.contiguous()
        experts, h, f = w_gate.shape
        cd = w_gate.dtype
        plan = _Plan(ring.size, send_splits, recv_splits, rows, offsets, group_sizes, experts, x.device)
        m = plan.m
        want = dict(zip(MOE_SAVED, saved))
        keep = {name: x.new_zeros((m, h if name == "xg" else f), dtype=cd) if want[name] else None
                for name in ("xg", "gate", "up", "act")}

        def compute(src: int, recv: Tensor, y_recv: Tensor) -> None:
            js = plan.grouped(src)
            if js.numel() == 0:
                return
            src_rows = plan.rows[js]
            xs = recv.index_select(0, src_rows).to(cd)
            g, u, a, y = _experts(xs, plan.counts[src], w_gate, w_up, w_down)
            y_recv.index_copy_(0, src_rows, y.to(x.dtype))
            for name, value in (("xg", xs), ("gate", g), ("up", u), ("act", a)):
                if keep[name] is not None:
                    keep[name].index_copy_(0, js, value)

        recv, out = _pipeline(ring, x, plan, compute)
        if keep["xg"] is not None:
            # Grouped rows past the last expert's end are gathered (Xg) but belong to no expert.
            idle = plan.idle()
            keep["xg"].index_copy_(0, idle, recv.index_select(0, plan.rows[idle]).to(cd))
        values = []
        for name in MOE_SAVED:
            if name == "recv":
                values.append(recv if want["recv"] else x.new_empty((0,)))
            else:
                values.append(keep[name] if keep[name] is not None else x.new_empty((0,)))
        return out, values


@register("p2p", "moe_experts_backward")
def moe_experts_backward(
    grad: Tensor,
    send_splits: list[int],
    recv_splits: list[int],
    rows: Tensor,
    offsets: Tensor | None,
    group_sizes: list[int],
    gate: Tensor,
    up: Tensor,
    wt_gate: Tensor,
    wt_up: Tensor,
    wt_down: Tensor,
    group_name: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The same schedule as the forward: the result gradients travel like the dispatch, each source's
    input gradients go back (like the combine) as soon as its rows are computed, own rows last."""
    with Ring(group_name, "moe_experts_backward") as ring:  # an exception in a step waits on its transfers first
        grad = grad.contiguous()
        experts, f, h = wt_gate.shape
        cd = wt_gate.dtype
        plan = _Plan(ring.size, send_splits, recv_splits, rows, offsets, group_sizes, experts, grad.device)
        m = plan.m
        dy_all = grad.new_zeros((m, h), dtype=cd)
        dg_all, du_all = grad.new_zeros((m, f), dtype=cd), grad.new_zeros((m, f), dtype=cd)

        def compute(src: int, recv: Tensor, dx_recv: Tensor) -> None:
            js = plan.grouped(src)
            if js.numel() == 0:
                return
            src_rows = plan.rows[js]
            dy = recv.index_select(0, src_rows).to(cd)
            dx, dg, du = _expert_grads(dy, gate.index_select(0, js), up.index_select(0, js), plan.counts[src], wt_gate,
                                       wt_up, wt_down)
            dx_recv.index_add_(0, src_rows, dx.to(grad.dtype))  # rows[] may repeat a received row: its gradients add
            dy_all.index_copy_(0, js, dy)
            dg_all.index_copy_(0, js, dg)
            du_all.index_copy_(0, js, du)

        recv, dx = _pipeline(ring, grad, plan, compute)
        # Grouped rows past the last expert's end still gather their result gradient (dY); dG, dU stay 0.
        idle = plan.idle()
        dy_all.index_copy_(0, idle, recv.index_select(0, plan.rows[idle]).to(cd))
        return dx, dy_all, dg_all, du_all
