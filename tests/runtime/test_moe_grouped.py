"""The ``torch._grouped_mm`` form of the moe_experts symm lowering (``runtime/moe_grouped.py``) on CPU:
its layout plan against a plain reference, the expert segments against float32 experts (separate and
fused gate/up weights, either layout and half order), and the choice between it and the Triton kernels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from overlap_backend.runtime import moe_grouped
from overlap_backend.spec import kernel_ratios, knobs


def _prefix(sizes):
    out = [0]
    for s in sizes:
        out.append(out[-1] + s)
    return out


def _case(ws, rank, experts, gen, *, holes=False, past_end=False, empty_source=False):
    """Received rows per source, grouped rows (a permutation of some received rows, expert-major),
    expert ends; ``holes``: some received rows no grouped row reads and grouped rows reading nothing."""
    recv = [int(v) for v in torch.randint(0, 9, (ws,), generator=gen)]
    if empty_source:
        recv[(rank + 1) % ws] = 0
    n = sum(recv)
    e_of = torch.randint(0, experts, (n,), generator=gen)
    if experts > 2:
        e_of[e_of == 1] = 0  # expert 1 empty
    rows = torch.sort(e_of, stable=True).indices
    sizes = torch.bincount(e_of, minlength=experts)
    if holes and n:
        rows[::3] = -1
    ends = torch.cumsum(sizes, 0)
    if past_end and n > 2:
        ends = ends.clamp(max=n - 2)
    return recv, rows, ends


def _reference_plan(rows, ends, recv, rank, ws, experts, cap, per_source):
    """What ``plan`` must give, by Python loops: each segment's read rows sorted by expert then grouped-row
    order, then its unread rows in received order."""
    recv_off = _prefix(recv)
    n = recv_off[-1]
    expert = [int(torch.searchsorted(ends, j, right=True)) for j in range(rows.numel())]
    read = {}
    for j, (i, e) in enumerate(zip(rows.tolist(), expert)):
        if i >= 0 and e < experts:
            read[i] = (e, j)
    src = [next(s for s in range(ws) if recv_off[s] <= i < recv_off[s + 1]) for i in range(n)]
    regions = [[s] for s in range(ws)] if per_source else [list(range(ws))]
    seg, drop, offs = [], [], []
    for reg in regions:
        mine = [i for i in range(n) if src[i] in reg]
        hit = sorted((i for i in mine if i in read), key=lambda i: read[i])
        seg += hit + [i for i in mine if i not in read]
        drop += [False] * len(hit) + [True] * (len(mine) - len(hit))
    for pos in range(ws if per_source else 1):
        reg = [(rank + 1 + pos) % ws] if per_source else list(range(ws))
        counts = [sum(1 for i, (e, _) in read.items() if e == k and src[i] in reg) for k in range(experts)]
        o = _prefix(counts)[1:]
        o[-1] = sum(recv[s] for s in reg)
        offs.append(o)
    slot = [src[i] * cap + i - recv_off[src[i]] for i in seg]
    return seg, slot, drop, offs


@pytest.mark.parametrize("per_source", [True, False], ids=["per-source", "one-segment"])
@pytest.mark.parametrize("ws,rank,experts", [(1, 0, 2), (2, 1, 3), (3, 0, 4), (4, 2, 1)])
@pytest.mark.parametrize("variant", ["plain", "holes", "past-end", "empty-source"])
def test_plan_matches_reference(ws, rank, experts, per_source, variant):
    gen = torch.Generator().manual_seed(ws * 100 + rank * 10 + experts)
    recv, rows, ends = _case(ws, rank, experts, gen, holes=variant == "holes", past_end=variant == "past-end",
                             empty_source=variant == "empty-source")
    cap = 9
    recv_off = torch.tensor(_prefix(recv), dtype=torch.int32)
    pl = moe_grouped.plan(rows, ends.to(torch.int32), recv_off, rank, ws, experts, sum(recv), cap, per_source)
    seg, slot, drop, offs = _reference_plan(rows, ends, recv, rank, ws, experts, cap, per_source)
    assert pl["seg"].tolist() == seg
    assert pl["slot"].tolist() == slot
    assert pl["drop"].view(-1).tolist() == drop
    assert pl["offs"].dtype == torch.int32 and pl["offs"].tolist() == offs


def _weights(experts, h, f, gen, layout):
    """(w_gate, w_up, w_down) bf16 [E, H, F], [E, H, F], [E, F, H]; fused layouts as views of one weight."""
    rnd = lambda *s: (torch.randn(*s, generator=gen) / s[-2] ** 0.5).to(torch.bfloat16)  # noqa: E731
    wd = rnd(experts, f, h)
    if layout == "split":
        return rnd(experts, h, f), rnd(experts, h, f), wd
    if layout in ("gate_up", "up_gate"):
        w = rnd(experts, h, 2 * f)
        a, b = w[..., :f], w[..., f:]
    else:  # F.linear's [E, 2F, H], transposed views
        w = rnd(experts, 2 * f, h).transpose(1, 2)
        a, b = w[..., :f], w[..., f:]
    return (a, b, wd) if layout != "up_gate" else (b, a, wd)


@pytest.mark.parametrize("layout", ["split", "gate_up", "up_gate", "linear"])
@pytest.mark.parametrize("per_source", [True, False], ids=["per-source", "one-segment"])
def test_segments_compute_the_experts(layout, per_source):
    """Every segment's Y, scattered to its received rows, is the op's semantics (unread rows: 0), on
    CPU's ``torch._grouped_mm``; fused weights are read through the one [E, H, 2F] view, not copied."""
    ws, rank, experts, h, f, cap = 3, 1, 3, 16, 24, 9
    gen = torch.Generator().manual_seed(7)
    recv, rows, ends = _case(ws, rank, experts, gen, holes=True, empty_source=True)
    recv_off = _prefix(recv)
    n = recv_off[-1]
    wg, wu, wd = _weights(experts, h, f, gen, layout)
    gate_up = moe_grouped.gate_up_weights(wg, wu)
    assert gate_up[0] == ("split" if layout == "split" else "fused")
    if gate_up[0] == "fused":
        assert gate_up[1].untyped_storage().data_ptr() == wg.untyped_storage().data_ptr()
    received = torch.randn(n, h, generator=gen).to(torch.bfloat16)
    disp = torch.full((ws * cap, h), float("nan"), dtype=torch.bfloat16)
    for s in range(ws):
        disp[s * cap : s * cap + recv[s]] = received[recv_off[s] : recv_off[s + 1]]
    pl = moe_grouped.plan(rows, ends.to(torch.int32), torch.tensor(recv_off, dtype=torch.int32), rank, ws, experts,
                          n, cap, per_source)
    got = torch.full((n, h), float("nan"))
    for seg_index, _, lo, hi in moe_grouped.schedule(ws, recv_off, per_source, rank):
        if hi > lo:
            got[pl["seg"][lo:hi]] = moe_grouped.experts(pl, seg_index, lo, hi, disp, gate_up, wd).float()
    want = torch.zeros(n, h)
    lo = 0
    for e, hi in enumerate(ends.tolist()):
        for j in range(lo, hi):
            i = int(rows[j])
            if i >= 0:
                xe = received[i].float()
                a = (F.silu(xe @ wg[e].float()) * (xe @ wu[e].float())).to(torch.bfloat16).float()
                want[i] = a @ wd[e].float()
        lo = hi
    assert torch.isfinite(got).all()
    assert ((got - want).norm() / want.norm()).item() < 2e-2


def test_schedule_is_remote_first():
    recv_off = [0, 2, 5, 9]
    assert moe_grouped.schedule(3, recv_off, True, 1) == [(0, [0], 5, 9), (1, [1], 0, 2), (2, [2], 2, 5)]
    assert moe_grouped.schedule(3, recv_off, False, 1) == [(0, [0, 1, 2], 0, 9)]


def test_fused_gate_up_only_for_halves_of_one_weight():
    w = torch.zeros(2, 8, 32, dtype=torch.bfloat16)
    fused, gate_first = moe_grouped.fused_gate_up(w[..., :16], w[..., 16:])
    assert gate_first and fused.shape == (2, 8, 32) and fused.stride() == w.stride()
    assert moe_grouped.fused_gate_up(w[..., 16:], w[..., :16])[1] is False
    assert moe_grouped.fused_gate_up(w[..., :8], w[..., 16:24]) is None  # not adjacent halves
    assert moe_grouped.fused_gate_up(w[..., :16], w[..., :16].clone()) is None


def _choose(x, wg, wu, wd, ws=2, comm_sms=0):
    return moe_grouped.choose(x, wg, wu, wd, ws, comm_sms)


def test_choice_by_knob_and_constraints():
    gen = torch.Generator().manual_seed(0)
    wg, wu, wd = _weights(2, 16, 24, gen, "split")
    x = torch.zeros(32, 16, dtype=torch.bfloat16)
    with knobs.moe.patch(EXPERT_GEMM="triton"):
        assert _choose(x, wg, wu, wd) == (False, "knobs.moe.EXPERT_GEMM = 'triton'")
    with knobs.moe.patch(EXPERT_GEMM="grouped_mm"):
        assert _choose(x, wg, wu, wd)[0]
        use, why = _choose(x, wg.half(), wu.half(), wd.half())
        assert not use and "bfloat16" in why
        odd = _weights(2, 12, 24, gen, "split")
        use, why = _choose(torch.zeros(32, 12, dtype=torch.bfloat16), *odd)
        assert not use and "multiples of 8" in why
        strided = torch.zeros(2, 16, 48, dtype=torch.bfloat16)[..., ::2]  # no contiguous dimension
        use, why = _choose(x, strided, wu, wd)
        assert not use and "w_gate strides" in why
    with knobs.moe.patch(EXPERT_GEMM="sometimes"), pytest.raises(ValueError, match="EXPERT_GEMM"):
        _choose(x, wg, wu, wd)


H200, H100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize("gpu,m,h,f,ws,want", [
    # H200 (kernels_h200x1_2026-12-06/record), ms of the form against the gate/up and down kernels:
    (H200, 256, 4096, 14336, 4, True),  # mixtral-decode ws 4: 0.267 against 0.221 + 0.125
    (H200, 256, 4096, 14336, 8, True),  # mixtral-decode ws 8: 0.285 against 0.207 + 0.117 (down alone wins)
    (H200, 1024, 7168, 2048, 4, False),  # deepseek-decode ws 4: 0.385 against 0.188 + 0.148
    (H200, 32768, 7168, 2048, 2, False),  # deepseek ws 2: 5.85 against 2.71 + 1.55
    # H100 (kernels_h100x1_2026-12-06/record_all): at mixtral-decode ws 4 0.328 against 0.239 + 0.130; at
    # deepseek-decode ws 4 0.412 against 0.206 + 0.155 (the two kernels together faster than the form); at mixtral
    # ws 2 the form is slower (5.30 against 3.03 + 1.39 ms)
    (H100, 256, 4096, 14336, 4, True),
    (H100, 1024, 7168, 2048, 4, False),
    (H100, 8192, 4096, 14336, 2, False)])
def test_auto_follows_the_measured_ratios(monkeypatch, gpu, m, h, f, ws, want):
    """``auto`` with the packaged ratio file (bench/results/kernels_h200x1_2026-12-06/record,
    kernels_h100x1_2026-12-06/record_all):
    grouped_mm exactly where the form measured faster than both Triton GEMMs together;
    never with a comm kernel (off CPU); nothing measured (no GPU of that name): Triton."""
    # (shape-only weights: choose reads shapes and strides)
    wg = torch.empty(2, h, f, dtype=torch.bfloat16, device="meta")
    wd = torch.empty(2, f, h, dtype=torch.bfloat16, device="meta")
    x = torch.empty(m, h, dtype=torch.bfloat16, device="meta")
    monkeypatch.setattr(moe_grouped, "problem", lambda *a: None)
    kernel_ratios.forget()
    try:
        monkeypatch.setattr(kernel_ratios, "gpu_name", lambda: gpu)
        with knobs.moe.patch(EXPERT_GEMM="auto"):
            assert _choose(x, wg, wg, wd, ws)[0] is want
            assert _choose(x, wg, wg, wd, ws, comm_sms=8)[0] is False
        kernel_ratios.forget()
        monkeypatch.setattr(kernel_ratios, "gpu_name", lambda: "Some Other GPU")
        with knobs.moe.patch(EXPERT_GEMM="auto"):
            assert _choose(x, wg, wg, wd, ws)[0] is False
    finally:
        kernel_ratios.forget()
