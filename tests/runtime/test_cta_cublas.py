"""The cuBLAS forms of the CTA-pipeline stages (``runtime/cta_cublas.py``) on CPU.

- The choice (``stage_gemms``): "auto" takes cuBLAS exactly where the ratio file says the stage's
  kernel measured above ``knobs.symm.CUBLAS_ABOVE_RATIO`` and the cuBLAS form measured faster than it (the
  packaged file's H200 entries, and a file of the test's own), the kernel where either was not measured
  near; forced values; bad values refused;
  nothing but shapes, dtype, GPU name, file and knobs in it (so every rank decides alike).
- The data path: stage 0 and the stage-1 share write the chunk-major blocks and ``keep`` the Triton
  kernels write (done flags after each block, in the kernel's order); the blocks shipped as
  ``cta_symm._push_blocks`` ships them, the tails' partial products as ``tail_kernel`` makes them;
  stage 1 waits for exactly the arrival and tail flags the kernel waits for, ships each row group
  once (the last one before its tails with ``SHIP_BEFORE_TAILS``), and the result is the MLP's
  (float64, plans with several row groups, shares, tails, tp 1 and 2, GELU and SwiGLU).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from overlap_backend.runtime import cta_cublas, cta_plan
from overlap_backend.spec import kernel_ratios, knobs
from overlap_backend.spec import symm_layout as layout

from ratio_files import entry as _entry


@pytest.fixture
def auto_forms():
    with knobs.cta.patch(STAGE0_GEMM="auto", STAGE1_GEMM="auto"):
        yield


def test_auto_takes_cublas_exactly_where_the_packaged_ratios_say_the_kernel_loses(auto_forms):
    """At every measured CTA shape of the packaged file (H200): cuBLAS iff ratio > the threshold and the
    cuBLAS form measured faster than the kernel."""
    H, F_, seen = 8192, 28672, 0
    for e in kernel_ratios.entries(kernel_ratios.PACKAGED):
        if e["kernel"] not in ("cta_stage0", "cta_stage1") or e["gpu"] != "NVIDIA H200":
            continue
        ws, M, tp = e["ws"], e["M"], e["ws"] // 2
        N = e["N"] * tp if e["kernel"] == "cta_stage1" else H
        assert (e["K"], e["N"]) == ((H, F_ // tp) if e["kernel"] == "cta_stage0" else (F_, N // tp)), e
        forms = cta_cublas.stage_gemms(ws, M, H, F_, N, torch.bfloat16, gpu="NVIDIA H200")
        form = forms[e["kernel"] == "cta_stage1"]
        measured = cta_cublas.form_ratio(e["kernel"], M, e["K"], e["N"], ws=ws, dtype=torch.bfloat16,
                                         fused=e["fused"], gpu="NVIDIA H200")
        faster = measured is not None and measured < e["ratio"]
        assert form == ("cublas" if e["ratio"] > knobs.symm.CUBLAS_ABOVE_RATIO and faster else "triton"), (e, forms)
        seen += 1
    assert seen >= 20  # both stages, several world sizes and M


def test_auto_follows_the_ratio_file_and_the_threshold(ratios, auto_forms):
    ratios(_entry("cta_stage0", 2, 512, 1024, 4096, 1.10, True),
           _entry("cta_stage1", 2, 512, 4096, 1024, 1.02, False),
           _entry("cta_stage0", 2, 4096, 1024, 4096, 0.98, True),
           _entry("cta_stage1", 2, 4096, 4096, 1024, 1.50, False),
           *(_entry(f"cta_stage{i}_cublas", 2, m, *kn, 1.01, i == 0)  # the forms: faster than a losing kernel
             for m in (512, 4096) for i, kn in ((0, (1024, 4096)), (1, (4096, 1024)))))
    args = dict(H=1024, F_=4096, N=1024, dtype=torch.bfloat16)
    assert cta_cublas.stage_gemms(2, 512, **args) == ("cublas", "triton")
    assert cta_cublas.stage_gemms(2, 600, **args) == ("cublas", "triton")  # nearest entry
    assert cta_cublas.stage_gemms(2, 4096, **args) == ("triton", "cublas")
    assert cta_cublas.stage_gemms(2, 512, 1024, 4096, 1024, torch.float32) == ("triton", "triton")  # not measured
    assert cta_cublas.stage_gemms(2, 16, **args) == ("triton", "triton")  # 5 octaves away: the kernel
    with knobs.symm.patch(CUBLAS_ABOVE_RATIO=1.2):
        assert cta_cublas.stage_gemms(2, 512, **args) == ("triton", "triton")
        assert cta_cublas.stage_gemms(2, 4096, **args) == ("triton", "cublas")
    with knobs.symm.patch(CUBLAS_ABOVE_RATIO=None):
        assert cta_cublas.stage_gemms(2, 4096, **args) == ("triton", "triton")


def test_auto_keeps_the_kernel_where_the_measured_cublas_form_is_not_faster(ratios, auto_forms):
    """bench_kernels' "cta_stage<i>_cublas" rows time the form itself (chunked GEMMs, a separate activation):
    where it measured no faster than the kernel, or was not measured, the kernel stays, though the kernel loses
    to one whole GEMM."""
    kernels = (_entry("cta_stage0", 2, 512, 1024, 4096, 1.10, True), _entry("cta_stage1", 2, 512, 4096, 1024, 1.20))
    args = dict(H=1024, F_=4096, N=1024, dtype=torch.bfloat16)
    ratios(*kernels)
    assert cta_cublas.stage_gemms(2, 512, **args) == ("triton", "triton")  # forms not measured: the kernels
    ratios(*kernels, _entry("cta_stage0_cublas", 2, 512, 1024, 4096, 1.15, True),
           _entry("cta_stage1_cublas", 2, 512, 4096, 1024, 1.05))
    assert cta_cublas.stage_gemms(2, 512, **args) == ("triton", "cublas")
    ratios(*kernels, _entry("cta_stage0_cublas", 2, 512, 1024, 4096, 1.04, True))
    assert cta_cublas.stage_gemms(2, 512, **args) == ("cublas", "triton")
    ratios(*kernels, _entry("cta_stage0_cublas", 2, 512, 1024, 4096, 1.04, False))  # another epilogue: not it
    assert cta_cublas.stage_gemms(2, 512, **args) == ("triton", "triton")


def test_forced_forms_and_bad_values(ratios):
    ratios(_entry("cta_stage0", 2, 512, 1024, 4096, 1.10, True))
    args = (2, 512, 1024, 4096, 1024, torch.bfloat16)
    for s0 in ("triton", "cublas"):
        for s1 in ("triton", "cublas"):
            with knobs.cta.patch(STAGE0_GEMM=s0, STAGE1_GEMM=s1):
                assert cta_cublas.stage_gemms(*args) == (s0, s1)
    for name in ("STAGE0_GEMM", "STAGE1_GEMM"):
        with knobs.cta.patch(**{name: "cuBLAS"}), pytest.raises(ValueError, match=name):
            cta_cublas.stage_gemms(*args)
    with pytest.raises(TypeError):
        knobs.cta.patch(STAGE0_GEMM=1).__enter__()


def test_the_choice_takes_no_rank():
    """Every rank of a group calls it with the same arguments (the group's shapes): no rank, group or
    device argument exists that could make ranks differ."""
    import inspect

    assert list(inspect.signature(cta_cublas.stage_gemms).parameters) == ["ws", "M", "H", "F_", "N", "dtype", "gpu"]


# --------------------------------------------------------------------------------- the data path
PLANS = [  # (M, H, F, N, tp, activation, approximate, bias, num_sms, ship_first)
    (1100, 64, 4096, 1024, 1, "gelu", "tanh", True, 8, True),  # 5 row groups, the last one's tail
    (1100, 64, 4096, 1024, 1, "gelu", "none", False, 8, False),
    (300, 64, 4096, 1024, 1, "gelu", "tanh", True, 132, True),  # one group: a share and a tail
    (700, 64, 4096, 1024, 2, "swiglu", "none", True, 8, False),  # SwiGLU share, 2 groups, 2 stage-0 ranks
    (1100, 64, 8192, 2048, 2, "gelu", "none", True, 8, False),  # tails of 2 stage-0 ranks
]


def _act(h, g, activation, approximate):
    return F.silu(h) * g if activation == "swiglu" else F.gelu(h, approximate=approximate)


@pytest.mark.parametrize("case", PLANS, ids=lambda c: f"M{c[0]}-F{c[2]}-tp{c[4]}-{c[5]}")
def test_blocks_flags_and_result_match_the_kernels_protocol(case):
    M, H, F_, N, tp, activation, approximate, bias, num_sms, ship_first = case
    torch.manual_seed(0)
    dt = torch.float64
    swiglu = activation == "swiglu"
    plan = cta_plan.chunk_plan(M, F_, N, tp, swiglu, torch.bfloat16, num_sms, H=H)
    f1, kchunk, nch, nch1, tail = plan.f1, plan.kchunk, plan.nch, plan.nch1, plan.tail
    fp, ns, bm = (F_ - f1) // tp, N // tp, plan.cfg0[0]
    mp, group_rows, m0 = plan.tiles_m * bm, bm * plan.cfg0[3], plan.tail_group * plan.cfg0[3] * bm
    assert tail or swiglu, plan  # the cases exercise tails (GELU) and shares
    x = torch.randn(M, H, dtype=dt)
    w1, w3 = torch.randn(H, F_, dtype=dt) / H**0.5, torch.randn(H, F_, dtype=dt) / H**0.5
    b1, b3 = (torch.randn(F_, dtype=dt), torch.randn(F_, dtype=dt)) if bias else (None, None)
    w2, b2 = torch.randn(F_, N, dtype=dt) / F_**0.5, (torch.randn(N, dtype=dt) if bias else None)
    h = x @ w1 + (b1 if bias else 0)
    a_ref = _act(h, x @ w3 + (b3 if bias else 0), activation, approximate)
    ref = a_ref @ w2 + (b2 if bias else 0)

    def cols(c):  # the placement's views of one rank's first-GEMM columns
        return (w1[:, c], None if b1 is None else b1[c], w3[:, c] if swiglu else None,
                None if b3 is None or not swiglu else b3[c])

    nan = float("nan")
    a = torch.full((tp * nch + nch1, mp, kchunk), nan, dtype=dt)  # every stage-1 rank's receive buffer
    part = torch.full((tp, M, N), nan, dtype=dt)  # the tails' partial products, [tp, M, Ns] per stage-1 rank
    for p in range(tp):  # stage 0
        blocks = torch.full((nch, mp, kchunk), nan, dtype=dt)
        keep = torch.full((mp - m0, tail), nan, dtype=dt) if tail else None
        done = []
        cta_cublas.stage0(x, cols(slice(p * fp, (p + 1) * fp)), blocks, keep, plan, fp, activation, approximate,
                          lambda g, j: done.append((g, j)))
        shipped = [(g, j) for g in range(plan.groups)
                   for j in range(min(nch, -(-(plan.fship if g == plan.tail_group else fp) // kchunk)))]
        assert done == shipped  # _push_blocks' order and blocks
        for g, j in done:  # the copy engine's pushes: the group's real rows of the block
            r0, r1 = g * group_rows, min(M, (g + 1) * group_rows)
            width = min(kchunk, (plan.fship if g == plan.tail_group else fp) - j * kchunk)
            assert torch.allclose(blocks[j, r0:r1, :width], a_ref[r0:r1, p * fp + j * kchunk:][:, :width])
            a[p * nch + j, r0:r1] = blocks[j, r0:r1]
        if tail:  # tail_kernel: keep @ its W2 rows
            assert torch.allclose(keep[:M - m0], a_ref[m0:, p * fp + plan.fship:(p + 1) * fp])
            part[p, m0:] = keep[:M - m0] @ w2[p * fp + plan.fship:(p + 1) * fp]
    if f1:  # stage-1 share, the last f1 columns
        cta_cublas.share(x, cols(slice(F_ - f1, F_)), a[tp * nch:], plan, activation, approximate)
        for i in range(nch1):
            width = min(kchunk, f1 - i * kchunk)
            assert torch.allclose(a[tp * nch + i, :M, :width], a_ref[:, F_ - f1 + i * kchunk:][:, :width])

    out = torch.full((M, N), nan, dtype=dt)
    for t in range(tp):  # stage 1, one consumer at a time, into one output (the collect's result)
        events, arrived = [], set()

        def wait(word, count, nbands):
            events.append(("wait", word, count))
            arrived.update(range(word, word + count))

        parts = part[:, :, t * ns:(t + 1) * ns] if tail else None
        cta_cublas.stage1(a, w2[:, t * ns:(t + 1) * ns], None if b2 is None else b2[t * ns:(t + 1) * ns], out, plan, fp,
                          t, parts, ship_first and tail > 0, wait, lambda r0, r1: events.append(("ship", r0, r1)),
                          lambda: events.append(("before_tails",)))
        want = {layout.CTA_ARRIVED + (g * tp + p) * nch + j for g in range(plan.groups) for p in range(tp)
                for j in range(-(-(plan.fship if g == plan.tail_group else fp) // kchunk))}
        if tail:
            want |= {layout.CTA_TAIL_ARRIVED + p * plan.tiles_m + m for p in range(tp)
                     for m in range(m0 // bm, plan.tiles_m)}
        assert arrived == want  # exactly the kernel's waits
        ships = [e[1:] for e in events if e[0] == "ship"]
        assert ships == [(g * group_rows, min(M, (g + 1) * group_rows)) for g in range(plan.groups)]
        kinds = [e[0] for e in events]
        last = len(kinds) - 1 - kinds[::-1].index("ship")
        if ship_first and tail:  # the last group's rows before its tails, their copy ordered before the adds
            assert kinds[last + 1] == "before_tails" and "wait" in kinds[last + 2:]
        elif tail:
            assert kinds[last - 1] == "wait" and "before_tails" not in kinds
    assert torch.allclose(out, ref, rtol=1e-9, atol=1e-9), (out - ref).abs().max()


def test_stage1_steps_walk_the_kernels_arrival_order():
    plan = cta_plan.chunk_plan(700, 4096, 1024, 2, True, torch.bfloat16, 8, H=64)
    fp = (4096 - plan.f1) // 2
    steps = cta_cublas.stage1_steps(plan, fp, 0)
    assert [s[3] for s in steps[:plan.nch1]] == [None] * plan.nch1  # the own share first
    flags = [s[3] for s in steps[plan.nch1:]]
    assert flags == [p * plan.nch + j for j in range(plan.nch) for p in range(2)]  # chunk j of every producer
    assert sum(s[2] for s in steps) == plan.f1 + 2 * fp  # every column once


@pytest.mark.parametrize("forms", [("cublas", "triton"), ("triton", "cublas"), ("cublas", "cublas")])
def test_plan_listing_names_the_cublas_forms(monkeypatch, forms):
    """The debug listing (runtime/plan.py) follows the forms; still valid Python."""
    from overlap_backend.runtime import cta_symm, plan

    meta = dict(device="meta", dtype=torch.bfloat16)
    ws, F_ = 2, 28672
    args = {"x": torch.empty(512, 8192, **meta), "w1": torch.empty(8192, F_ // ws, **meta), "b1": None, "w3": None,
            "b3": None, "w2": torch.empty(F_ // ws, 8192, **meta), "b2": None, "activation": "gelu",
            "approximate": "tanh", "stages": 2, "group_name": "g", "lowering": "symm"}
    monkeypatch.setattr(cta_symm, "problem", lambda *a: None)  # meta tensors stand for CUDA ones
    with knobs.cta.patch(STAGE0_GEMM=forms[0], STAGE1_GEMM=forms[1], TRANSPORT="peer"):
        stage0, stage1 = (plan.render("cta_pipeline_mlp", args, r, ws) for r in (0, 1))
    for text in (stage0, stage1):
        compile(text, "cta.py", "exec")
    assert ("cublas_stage0(" in stage0) == (forms[0] == "cublas") != ("launch(stage0_kernel, x, placed.w1," in stage0)
    assert ("cublas_stage1(" in stage1) == (forms[1] == "cublas") != ("launch(stage1_kernel" in stage1)
    assert ("cuMemcpyAsync(dst=peer_buf(" in stage0) == (forms[0] == "cublas")  # staged whatever the transport
