"""The portable ``p2p`` lowering: CommFuse decomposition over torch.distributed point-to-point.

Runs wherever torch.distributed P2P runs (NCCL, gloo; one node or many). Every op is a ring over
the process group: rank r sends to r+1 and receives from r-1.

- ``ag_mm``: step s computes on the chunk that arrived at step s-1 (step 0: the local shard) while
  the next chunk is in flight; ws compute steps, ws-1 transfers, none after the last compute.
- ``mm_rs``: partial products travel the ring and accumulate. At step s rank r computes its partial
  for chunk (r-s-1) mod ws while the accumulator for that chunk (summed by the ranks before it)
  arrives; its own chunk is computed last, so nothing is communicated after the final compute.
- ``mm_ar``: the ``mm_rs`` decomposition over row chunks, then an all-gather of the reduced chunks.

On CUDA the transfers are issued from a dedicated high-priority communication stream; the compute
stream waits on a transfer (``Work.wait``) only right before it reads the received chunk. On gloo
the transfers are asynchronous work objects that progress while this thread computes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.distributed_c10d import _resolve_process_group

from ..spec import epilogue as _epilogue
from .lowering import register
from .streams import P2P_RING, comm_stream

# torch 2.13 deprecates all_gather_into_tensor for all_gather_single (same signature); 2.11 has only the former
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

_REDUCE_INPLACE = {
    "sum": lambda acc, x: acc.add_(x),
    "avg": lambda acc, x: acc.add_(x),
    "product": lambda acc, x: acc.mul_(x),
    "min": lambda acc, x: torch.minimum(acc, x, out=acc),
    "max": lambda acc, x: torch.maximum(acc, x, out=acc),
}


def start_batch(ops: Sequence[dist.P2POp]) -> list[dist.Work]:
    """Start ``ops`` as one batch; on CUDA from the communication stream, after everything queued
    on the compute stream (which produced what is sent)."""
    if not ops:
        return []
    tensor = ops[0].tensor
    if tensor.is_cuda:
        stream = comm_stream(tensor.device.index, P2P_RING)
        stream.wait_stream(torch.cuda.current_stream(tensor.device))
        with torch.cuda.stream(stream):
            return list(dist.batch_isend_irecv(list(ops)))
    return list(dist.batch_isend_irecv(list(ops)))


class P2PError(RuntimeError):
    """A transfer of the ``p2p`` lowering failed or did not finish within ``OVERLAP_TIMEOUT_S``:
    a peer died, diverged (skipped or reordered an op call) or is far behind."""


def sends_cuda_tensors(group) -> bool:
    """Whether the group's backend sends CUDA tensors point to point. gloo sends CPU tensors only:
    given a CUDA tensor it aborts the process ("writev ... Bad address"). A backend string such as
    ``cpu:gloo,cuda:nccl`` names a CUDA one."""
    backend = str(dist.get_backend(group)).lower()
    return not ("gloo" in backend and "cuda:" not in backend)


class GroupP2P:
    """Per-group state of the ``p2p`` lowering, created at the group's first call and reused by every
    later call, from any compiled graph (a recompile for a new shape finds the same object).

    It holds no buffers (the ring's chunks come from the caching allocator per call), only what is
    fixed for the group: its ring neighbours and the wait timeout. ``_GROUPS`` is keyed by group name;
    a name that resolves to another group object (the group was destroyed and a new one got its name)
    gets a fresh entry, and ``dist.destroy_process_group`` drops the entries of destroyed groups.
    """

    def __init__(self, group_name: str, group):
        from ..config import OverlapConfig

        self.name = group_name
        self.group = group
        self.size = group.size()
        self.rank = group.rank()
        self.next = (self.rank + 1) % self.size
        self.prev = (self.rank - 1) % self.size
        # OVERLAP_TIMEOUT_S, read once per group (as the symm lowering does)
        self.timeout_s = OverlapConfig.env_value("timeout_s")
        self.timeout = timedelta(seconds=self.timeout_s)
        self.calls = 0  # op calls on this group (diagnostics)
        self.cpu_only = not sends_cuda_tensors(group)  # then a call with CUDA tensors raises P2PError


_GROUPS: dict[str, GroupP2P] = {}


def group_state(group_name: str) -> GroupP2P:
    """The group's :class:`GroupP2P` (created on first use)."""
    group = _resolve_process_group(group_name)
    st = _GROUPS.get(group_name)
    if st is None or st.group is not group:
        st = _GROUPS[group_name] = GroupP2P(group_name, group)
    return st


def forget_destroyed_groups() -> None:
    """Drop the state of groups that no longer resolve (called after ``destroy_process_group``)."""
    for name in list(_GROUPS):
        try:
            alive = _resolve_process_group(name) is _GROUPS[name].group
        except Exception:  # noqa: BLE001 - c10d raises for an unknown name
            alive = False
        if not alive:
            del _GROUPS[name]


class Ring:
    """One op call's ring over ``group_name``: this rank's neighbours and the transfers between them.

    ``op`` names the op in errors. Waits on transfers of CPU tensors (gloo) are bounded by
    ``OVERLAP_TIMEOUT_S``: a peer that never makes its side of a transfer, or died, turns into a
    :class:`P2PError` on this rank naming the op, the step and the peers. Transfers of CUDA
    tensors are waited for without a timeout (a timed ``Work.wait`` blocks the host until the GPU
    is done, which would serialise the ring); NCCL's own watchdog (the process group's ``timeout``)
    bounds them.

    Used as a context manager (``with Ring(...) as ring:``), every transfer started and not yet
    waited on is waited on (within ``OVERLAP_TIMEOUT_S``, its own errors dropped) when an exception
    leaves the block, before the exception propagates: a transfer left posted would make the peer's
    matching one, or the group's next collective, wait forever.
    """

    def __init__(self, group_name: str, op: str = "p2p"):
        st = group_state(group_name)
        if st.size < 1 or st.rank < 0:
            raise RuntimeError(f"overlap p2p: this process is not a member of group {group_name!r}")
        st.calls += 1
        self.state = st
        self.op = op
        self.group, self.size, self.rank, self.next, self.prev = st.group, st.size, st.rank, st.next, st.prev
        self._cuda = False
        self.pending: list[dist.Work] = []  # started and not yet waited on

    def __enter__(self) -> Ring:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.drain()

    def drain(self) -> None:
        """Wait on every pending transfer, dropping their errors (an error is already propagating);
        on gloo all of them together within one ``OVERLAP_TIMEOUT_S``."""
        pending, self.pending = self.pending, []
        deadline = time.monotonic() + self.state.timeout_s
        for w in pending:
            try:
                if self._cuda:
                    w.wait()
                else:
                    # at least 1 ms: a zero timedelta means no timeout to gloo
                    w.wait(timedelta(seconds=max(deadline - time.monotonic(), 1e-3)))
            except Exception:  # noqa: BLE001 - the exception that made us drain is the one to report
                pass

    def shift(self, send: Tensor | None, recv: Tensor | None) -> list[dist.Work]:
        """Start sending ``send`` to the next rank and receiving ``recv`` from the previous one."""
        ops = []
        if send is not None:
            ops.append(dist.P2POp(dist.isend, send, group=self.group, group_peer=self.next))
        if recv is not None:
            ops.append(dist.P2POp(dist.irecv, recv, group=self.group, group_peer=self.prev))
        return self.start(ops)

    def start(self, ops: Sequence[dist.P2POp]) -> list[dist.Work]:
        """Start ``ops`` (P2P operations on this ring's group) as one batch. A peer found dead at
        this point (gloo raises on a send whose connection its peer closed) is a :class:`P2PError`
        too, as at a wait."""
        if ops and ops[0].tensor.is_cuda:
            self._cuda = True
            if self.state.cpu_only:
                raise P2PError(
                    f"overlap p2p: {self.op} on rank {self.rank} of group {self.state.name!r}: the group is a gloo "
                    f"group and gloo cannot send CUDA tensors point to point. Run the group on NCCL "
                    f"(OVERLAP_LOWERING=symm on one node), or leave this op out (OVERLAP_PASSES)."
                )
        try:
            works = start_batch(ops)
        except RuntimeError as e:
            raise self.error("starting a ring step's transfers", e) from e
        self.pending.extend(works)
        return works

    def wait(self, works: Sequence[dist.Work], what: str = "") -> None:
        """Wait for ``works`` (on CUDA: make the compute stream wait; the host does not block).
        ``what`` says which transfer, for the error."""
        timeout = None if self._cuda else self.state.timeout
        for w in works:
            self.pending = [p for p in self.pending if p is not w]
            try:
                if timeout is None:
                    w.wait()
                else:
                    w.wait(timeout)
            except RuntimeError as e:
                raise self.error(what or "a ring step", e) from e

    def all_gather(self, out: Tensor, inp: Tensor) -> dist.Work:
        """Start ``all_gather(out, inp)`` over the group; :meth:`wait` for it."""
        if inp.is_cuda:
            self._cuda = True
        work = all_gather_single(out, inp, group=self.group, async_op=True)
        self.pending.append(work)
        return work

    def error(self, what: str, cause: BaseException) -> P2PError:
        st = self.state
        return P2PError(
            f"overlap p2p: {self.op} on rank {self.rank} of group {st.name!r} ({st.size} ranks; sends to rank "
            f"{self.next}, receives from rank {self.prev}): {what} failed or did not finish within "
            f"OVERLAP_TIMEOUT_S={st.timeout_s:g} s. A peer died, diverged (skipped or reordered an overlap op "
            f"call) or is far behind; this rank's output is garbage and the group's connections may be "
            f"unusable. Cause: {type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"
        )


def matmul(a: Tensor, w: Tensor, bias: Tensor | None, out: Tensor | None = None) -> Tensor:
    if bias is None:
        return torch.mm(a, w, out=out)
    return torch.addmm(bias, a, w, out=out)


# ----------------------------------------------------------------------------------------- ag_mm
@register("p2p", "ag_mm")
def ag_mm(
    shard: Tensor,
    weights: list[Tensor],
    biases: list[Tensor | None],
    gather_dim: int,
    group_name: str,
    return_gathered: bool,
    epilogues: Sequence[str] = (),
    epilogue_args: Sequence[Tensor | None] = (),
) -> tuple[Tensor, list[Tensor]]:
    # Inputs were validated by the op (runtime/checks.py), identically on every rank.
    with Ring(group_name, "ag_mm") as ring:  # an exception in a step waits on its transfers first
        ws, r = ring.size, ring.rank
        shard = shard.contiguous()
        dim = gather_dim % shard.dim()
        k = shard.shape[-1]
        contraction_split = dim == shard.dim() - 1
        gshape = list(shard.shape)
        gshape[dim] *= ws
        # chunks[c] receives rank c's shard.
        chunks = shard.new_empty((ws, *shard.shape))
        chunks[r].copy_(shard)

        rows = math.prod(gshape[:-1])
        outs = [shard.new_empty((rows, w.shape[1])) for w in weights]
        step_len = shard.shape[dim]

        chunk_rows = math.prod(shard.shape[:-1])

        def compute(c: int, first: bool) -> None:
            # explicit row counts: reshape(-1, 0) of an empty chunk (K = 0) is ambiguous
            a = chunks[c].reshape(chunk_rows, k)
            for i, (w, out) in enumerate(zip(weights, outs)):
                bias = biases[i] if biases else None
                if contraction_split:
                    # G[:, c*k:(c+1)*k] @ W[c*k:(c+1)*k]: partial products summed over the chunks.
                    wk = w[c * k : (c + 1) * k]
                    if first:
                        out.copy_(matmul(a, wk, bias))
                    else:
                        out.addmm_(a, wk)
                else:
                    out_nd = out.view(*gshape[:-1], w.shape[1])
                    dst = out_nd.narrow(dim, c * step_len, step_len)
                    if dst.is_contiguous():  # gather dim 0 (or leading dims of size 1): write in place
                        matmul(a, w, bias, out=dst.view(chunk_rows, w.shape[1]))
                    else:
                        dst.copy_(matmul(a, w, bias).view(dst.shape))

        for step in range(ws):
            c = (r - step) % ws
            works = []
            if step < ws - 1:
                # Forward chunk c to the next rank and take chunk c-1 from the previous one while we
                # compute on chunk c.
                works = ring.shift(chunks[c], chunks[(c - 1) % ws])
            compute(c, first=step == 0)
            ring.wait(works, f"ring step {step} (chunk of rank {(c - 1) % ws})")

        if not return_gathered:
            gathered = shard.new_empty((0,))
        elif dim == 0:
            gathered = chunks.view(gshape)
        else:
            gathered = torch.cat(chunks.unbind(0), dim=dim)
        return gathered, _epilogue.apply_all(list(epilogues), outs, epilogue_args)


# ----------------------------------------------------------------------------------------- mm_rs
def reduce_scatter_matmul(
    ring: Ring,
    partial,
    chunk_shape: Sequence[int],
    dtype: torch.dtype,
    device: torch.device,
    reduce_op: str,
) -> Tensor:
    """Ring reduce-scatter of ``partial(c)`` (this rank's contribution to chunk c), own chunk last."""
    if reduce_op not in _REDUCE_INPLACE:
        raise ValueError(f"overlap p2p: unsupported reduce_op {reduce_op!r}; allowed: {', '.join(_REDUCE_INPLACE)}")
    combine = _REDUCE_INPLACE[reduce_op]
    ws, r = ring.size, ring.rank
    acc = partial((r - 1) % ws).contiguous()
    for step in range(1, ws):
        c = (r - step - 1) % ws
        incoming = torch.empty(chunk_shape, dtype=dtype, device=device)
        works = ring.shift(acc, incoming)
        mine = partial(c).contiguous()  # overlaps the transfer of the accumulator for chunk c
        ring.wait(works, f"ring step {step} (partial sums of chunk {c})")
        acc = combine(mine, incoming)
    if reduce_op == "avg":
        acc = acc.div_(ws)
    return acc


@register("p2p", "mm_rs")
def mm_rs(
    a: Tensor,
    b: Tensor,
    bias: Tensor | None,
    out_shape: list[int],
    scatter_dim: int,
    reduce_op: str,
    group_name: str,
    epilogue: str = "",
    epilogue_args: Sequence[Tensor | None] = (),
) -> Tensor:
    # Inputs were validated by the op (runtime/checks.py): out_shape matches a @ b, its scatter dim
    # divides by the group size.
    with Ring(group_name, "mm_rs") as ring:  # an exception in a step waits on its transfers first
        ws = ring.size
        out_shape = list(out_shape)
        dim = scatter_dim % len(out_shape)
        step_len = out_shape[dim] // ws
        chunk_shape = list(out_shape)
        chunk_shape[dim] = step_len
        last = dim == len(out_shape) - 1
        a_nd = a.reshape(*out_shape[:-1], a.shape[1])  # a copy only when a's layout cannot be viewed so

        def partial(c: int) -> Tensor:
            lo, hi = c * step_len, (c + 1) * step_len
            if last:
                return matmul(a, b[:, lo:hi], None if bias is None else bias[..., lo:hi]).view(chunk_shape)
            rows = a_nd.narrow(dim, lo, step_len).reshape(math.prod(chunk_shape[:-1]), a.shape[1])
            return matmul(rows, b, bias).view(chunk_shape)

        dtype = torch.result_type(a, b)
        mine = reduce_scatter_matmul(ring, partial, chunk_shape, dtype, a.device, reduce_op)
        return _epilogue.apply(epilogue, mine, epilogue_args)


# ----------------------------------------------------------------------------------------- mm_ar
@register("p2p", "mm_ar")
def mm_ar(
    a: Tensor,
    b: Tensor,
    bias: Tensor | None,
    reduce_op: str,
    group_name: str,
    epilogue: str = "",
    epilogue_args: Sequence[Tensor | None] = (),
) -> Tensor:
    with Ring(group_name, "mm_ar") as ring:  # an exception in a step waits on its transfers first
        ws = ring.size
        m, n = a.shape[0], b.shape[1]
        step_len = -(-m // ws)  # row chunks of equal length; the last ones are zero-padded
        dtype = torch.result_type(a, b)

        def partial(c: int) -> Tensor:
            lo, hi = min(c * step_len, m), min((c + 1) * step_len, m)
            res = matmul(a[lo:hi], b, bias)
            if hi - lo < step_len:
                res = torch.cat([res, res.new_zeros((step_len - (hi - lo), n))])
            return res

        mine = reduce_scatter_matmul(ring, partial, (step_len, n), dtype, a.device, reduce_op)
        full = torch.empty((ws * step_len, n), dtype=dtype, device=a.device)
        ring.wait([ring.all_gather(full, mine)], "the all-gather of the reduced chunks")
        return _epilogue.apply(epilogue, full[:m] if ws * step_len != m else full, epilogue_args)
