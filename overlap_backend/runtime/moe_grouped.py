"""``torch._grouped_mm`` form of the ``moe_experts`` symm lowering's expert GEMMs (docs/moe.md).

Where this form measured faster than the persistent Triton producer (``codegen/moe_gemm.py``) on this GPU
(``spec/kernel_ratios.json``: on an H200 at 3 of 6 decode shapes, bench/results/kernels_h200x1_2026-12-06/record),
the lowering keeps its overlap protocol and computes the experts with cuBLAS/CUTLASS instead: per segment of the
schedule (one source position in the remote-first order, or every position at once where the Triton path goes
expert-major) the compute stream waits for the segment's dispatch flags by a stream memory operation, gathers its
rows expert-major, runs the gate/up grouped GEMM (one on a fused [E, K, 2F] weight), SwiGLU, the down grouped GEMM,
scatters the rows into ``out`` (own rows) or the staging buffer (remote rows) and raises ``MOE_DONE[pos]`` by a
stream write, so the combine ships the segment as soon as it is ready.

``torch._grouped_mm`` needs each group's rows consecutive from a host-known first row, while the
Triton path's plan puts segment starts on the device. So this plan (device ops, no host read) lays
positions out in received-row order: segment ``s`` (source ``s``, or everything) owns positions
``recv_off[s] .. recv_off[s + 1]``; first the rows its grouped rows read, sorted by expert, then the
received rows no grouped row reads (valid grouped rows are distinct: the op's contract). Those last
ones are computed as part of the last expert and zeroed after SwiGLU, which makes their results 0
(what the op's semantics give them), so the scatter writes every received row exactly once and
nothing needs zeroing first.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import Tensor

from ..spec import kernel_ratios, knobs
from ..spec.knobs.base import generation

log = logging.getLogger("overlap_backend.symm")

CHOICES = ("auto", "triton", "grouped_mm")
_decisions: dict[tuple, tuple[bool, str]] = {}
_logged: set[str] = set()


def _weight_problem(name: str, w: Tensor) -> str | None:
    """Why ``torch._grouped_mm`` cannot read ``w`` [E, K, N] in place: it takes rows or columns contiguous
    per expert with 16-byte-aligned strides (its meta function's check) and base."""
    es = w.element_size()
    _, k, n = w.shape
    s0, s1, s2 = w.stride()
    major = (s2 == 1 and s1 >= max(1, n) and (s1 * es) % 16 == 0) or (s1 == 1 and s2 >= max(1, k) and (s2 * es) % 16 == 0)
    if not major or (s0 * es) % 16 or w.data_ptr() % 16:
        return f"{name} strides {tuple(w.stride())} (torch._grouped_mm: rows or columns contiguous, 16-byte aligned)"
    return None


def fused_gate_up(w_gate: Tensor, w_up: Tensor) -> tuple[Tensor, bool] | None:
    """(the one [E, K, 2F] view whose halves are ``w_gate`` and ``w_up``, gate half first), or None where
    they are not the two halves of one weight ([E, H, 2F], or F.linear's [E, 2F, H] transposed)."""
    if (w_gate.shape != w_up.shape or w_gate.stride() != w_up.stride() or w_gate.dtype != w_up.dtype
            or w_gate.device != w_up.device or w_gate.untyped_storage().data_ptr() != w_up.untyped_storage().data_ptr()):
        return None
    e, k, f = w_gate.shape
    step = f * w_gate.stride(2)
    delta = w_up.storage_offset() - w_gate.storage_offset()
    if step <= 0 or delta not in (step, -step):
        return None
    first = w_gate if delta == step else w_up
    return first.as_strided((e, k, 2 * f), first.stride(), first.storage_offset()), delta == step


def problem(x: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor) -> str | None:
    """Why the grouped_mm form cannot run this call (None: it can); shapes, dtypes, strides and device only."""
    if not hasattr(torch, "_grouped_mm"):
        return "this torch has no torch._grouped_mm"
    if w_gate.dtype != torch.bfloat16:
        return f"compute dtype {w_gate.dtype} (torch._grouped_mm: bfloat16)"
    h, f = w_gate.shape[1], w_gate.shape[2]
    if h % 8 or f % 8:
        return f"H={h}, F={f} not multiples of 8 (torch._grouped_mm: 16-byte-aligned rows)"
    if x.is_cuda and torch.cuda.get_device_capability(x.device)[0] not in (9, 10):
        # elsewhere torch falls back to a loop that reads the offsets on the host: a synchronisation,
        # and no CUDA-graph capture
        return "torch._grouped_mm's CUTLASS kernel needs sm90 or sm100"
    fused = fused_gate_up(w_gate, w_up)
    ws = [("w_gate_up", fused[0])] if fused else [("w_gate", w_gate), ("w_up", w_up)]
    for name, w in ws + [("w_down", w_down)]:
        why = _weight_problem(name, w)
        if why:
            return why
    return None


def choose(x: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor, ws: int, comm_sms: int) -> tuple[bool, str]:
    """(compute the experts with ``torch._grouped_mm``, why), by ``knobs.moe.EXPERT_GEMM``: "triton",
    "grouped_mm" (where its constraints hold), or "auto": :func:`grouped_wins` at the rows of x (the same on
    every rank, so every rank decides alike). One path for both GEMMs: the Triton gate/up writes its
    activations in the device-sorted order that only the Triton down reads. Never with a comm kernel (CUDA).
    Cached per key."""
    mode = knobs.moe.EXPERT_GEMM
    key = (generation(), mode, x.shape[0], x.dtype, x.device, ws, comm_sms > 0, w_gate.shape, w_gate.dtype,
           w_gate.stride(), w_up.stride(), w_down.stride(), w_gate.data_ptr(), w_up.data_ptr(), w_down.data_ptr())
    hit = _decisions.get(key)
    if hit is None:
        hit = _decisions[key] = _choose(mode, x, w_gate, w_up, w_down, ws, comm_sms)
        if len(_decisions) > 4096:
            _decisions.clear()
        if hit[1] not in _logged:
            _logged.add(hit[1])
            log.info("overlap symm: moe_experts expert GEMMs on %s: %s", "grouped_mm" if hit[0] else "triton", hit[1])
    return hit


def form_faster(m: int, h: int, f: int, ws: int, dtype, gpu: str | None = None) -> bool | None:
    """Did this module's form (bench_kernels' ``moe_grouped_mm``: its segments, gather, grouped GEMMs and
    scatter) measure faster than the two Triton kernels together near these ``m`` rows? None where one of
    the three was not measured there."""
    kw = {"ws": ws, "dtype": dtype, "gpu": gpu}
    found = (kernel_ratios.nearest("moe_grouped_mm", m, h, f, fused=True, **kw),
             kernel_ratios.nearest("moe_gate_up", m, h, f, fused=True, **kw),
             kernel_ratios.nearest("moe_down", m, f, h, **kw))
    ms = [kernel_ratios.kernel_ms(e) if e is not None else None for e in found]
    if any(t is None for t in ms):
        return None
    return ms[0] < ms[1] + ms[2]


def grouped_wins(m: int, h: int, f: int, ws: int, dtype, gpu: str | None = None) -> tuple[bool, str]:
    """"auto"'s choice (and why): grouped_mm where the form (its gather, grouped GEMMs and scatter) measured
    faster than both Triton GEMMs together near this shape on this GPU, so one kernel's loss can outweigh the
    other's win; Triton where it measured slower or was not measured (the kernels losing to the grouped GEMMs
    alone does not tell: on an H100 the gather and scatter cost more than the kernels lose at prefill sizes).
    The cost model prices the same decision."""
    where = f"near M={m} H={h} F={f} ws={ws}"
    faster = form_faster(m, h, f, ws, dtype, gpu)
    if faster is None:
        return False, f"the grouped_mm form and the Triton expert GEMMs not all measured {where}"
    verdict = "faster" if faster else "slower"
    return faster, f"the grouped_mm form (gather, grouped GEMMs, scatter) measured {verdict} than the Triton GEMMs {where}"


def _choose(mode, x, w_gate, w_up, w_down, ws, comm_sms) -> tuple[bool, str]:
    if mode not in CHOICES:
        raise ValueError(f"knobs.moe.EXPERT_GEMM must be one of {CHOICES}, not {mode!r}")
    if mode == "triton":
        return False, "knobs.moe.EXPERT_GEMM = 'triton'"
    why = problem(x, w_gate, w_up, w_down)
    if why:
        return False, why
    if comm_sms > 0 and x.device.type != "cpu":
        # the comm kernel spins on its SMs from the call's start, and torch loads its kernels lazily: a
        # load may synchronise the context (codegen/launcher.py preloads the Triton kernels for this).
        # (The interpreter, on CPU, runs the comm kernel after the GEMMs.)
        return False, "a comm kernel runs (OVERLAP_MOE_COMM_SMS > 0): torch's kernels are not preloaded"
    if mode == "grouped_mm":
        return True, "knobs.moe.EXPERT_GEMM = 'grouped_mm'"
    m, (_, h, f) = x.shape[0], w_gate.shape
    return grouped_wins(m, h, f, ws, w_gate.dtype)


def plan(rows: Tensor, ends: Tensor, recv_off: Tensor, rank: int, ws: int, experts: int, n_recv: int, cap: int,
         per_source: bool) -> dict:
    """Device-side layout (no host read) of the grouped_mm form: ``rows`` [m] (received row of each
    grouped row, < 0: none), ``ends`` [E] cumulative expert ends over grouped rows, ``recv_off`` [ws + 1].

    Segments: one per source position ``pos`` (source ``(rank + 1 + pos) % ws``) with ``per_source``,
    else one. Returns per position ``i`` of ``[0, n_recv)``: ``seg`` (its received row), ``slot`` (that
    row's row in the dispatch buffer ``[ws * cap, H]``), ``drop`` ([n_recv, 1], no grouped row reads it);
    ``offs`` [segments, E] int32 (``torch._grouped_mm``'s ends within each segment; the last expert's is
    the segment's size, taking in the unread rows)."""
    dev = rows.device
    m = rows.shape[0]
    rows = rows.to(torch.long)
    recv_off = recv_off.to(torch.long)
    j = torch.arange(m, device=dev)
    expert = torch.searchsorted(ends.to(torch.long), j, right=True)
    valid = (rows >= 0) & (expert < experts)
    target = torch.where(valid, rows, n_recv)  # n_recv: a dummy position for the grouped rows that read nothing
    i = torch.arange(n_recv, device=dev)
    source = torch.searchsorted(recv_off[1:], torch.cat([i, i.new_zeros(1)]), right=True)  # [n_recv + 1]
    region = source if per_source else torch.zeros_like(source)
    stride_e = m + n_recv + 1  # key = region * (E + 1) * stride_e + expert * stride_e + (j or m + i)
    key = region * ((experts + 1) * stride_e) + experts * stride_e + m + torch.cat([i, i.new_zeros(1)])
    key.scatter_(0, target, region[target] * ((experts + 1) * stride_e) + expert * stride_e + j)
    read = torch.zeros(n_recv + 1, dtype=torch.bool, device=dev).index_fill_(0, target, True)
    _, seg = torch.sort(key[:n_recv])
    src = source[seg]
    pos = (source[target] - rank - 1) % ws
    segments = ws if per_source else 1
    g = torch.where(valid, (pos * experts if per_source else 0) + expert, segments * experts)
    counts = torch.zeros(segments * experts + 1, dtype=torch.long, device=dev).scatter_add_(0, g, torch.ones_like(g))
    offs = torch.cumsum(counts[:-1].view(segments, experts), 1)
    sizes = recv_off[1:] - recv_off[:-1]
    sizes = torch.roll(sizes, -(rank + 1)) if per_source else recv_off[-1:]  # in position order
    offs = torch.cat([offs[:, :-1], sizes[:, None]], 1).to(torch.int32)
    return {"seg": seg, "slot": src * cap + seg - recv_off[src], "drop": ~read[seg][:, None], "offs": offs}


def gate_up_weights(w_gate: Tensor, w_up: Tensor):
    """What ``experts`` reads: the fused view (one GEMM) where both are halves of one weight, else both."""
    fused = fused_gate_up(w_gate, w_up)
    return ("fused", *fused) if fused else ("split", w_gate, w_up)


def experts(pl: dict, seg_index: int, lo: int, hi: int, disp: Tensor, gate_up, w_down: Tensor) -> Tensor:
    """Y [hi - lo, H] (compute dtype) of positions ``lo .. hi`` (segment ``seg_index``): gather the rows
    from the dispatch buffer, gate/up grouped GEMM(s), SwiGLU (unread rows: 0), down grouped GEMM."""
    cd = w_down.dtype
    xs = disp.index_select(0, pl["slot"][lo:hi])
    if xs.dtype != cd:
        xs = xs.to(cd)
    offs = pl["offs"][seg_index]
    if gate_up[0] == "fused":
        _, w, gate_first = gate_up
        gu = torch._grouped_mm(xs, w, offs=offs)
        f = w.shape[2] // 2
        g, u = (gu[:, :f], gu[:, f:]) if gate_first else (gu[:, f:], gu[:, :f])
    else:
        g, u = torch._grouped_mm(xs, gate_up[1], offs=offs), torch._grouped_mm(xs, gate_up[2], offs=offs)
    act = F.silu(g).mul_(u).masked_fill_(pl["drop"][lo:hi], 0)  # (masked, not multiplied: NaN * 0 is NaN)
    return torch._grouped_mm(act, w_down, offs=offs)


def schedule(ws: int, recv_off: list[int], per_source: bool, rank: int) -> list[tuple[int, list[int], int, int]]:
    """(segment, source positions it covers, first position, end position) in launch order: remote-first
    (sources rank+1, rank+2, ..., own last), or one segment of every position."""
    if not per_source:
        return [(0, list(range(ws)), 0, recv_off[-1])]
    out = []
    for pos in range(ws):
        s = (rank + 1 + pos) % ws
        out.append((pos, [pos], recv_off[s], recv_off[s + 1]))
    return out
