"""The cost model reads the measured kernel / cuBLAS ratios (spec/kernel_ratios.py): its symm GEMM
times follow them, and where the runtime takes cuBLAS for a measured shape so does the model."""

from __future__ import annotations

import json

import pytest

from overlap_backend.cost import model
from overlap_backend.cost.calibration import DEFAULTS
from overlap_backend.cost.model import Problem
from overlap_backend.spec import kernel_ratios, knobs

H200 = DEFAULTS["h200"]
BF16 = "bfloat16"


@pytest.fixture
def ratios(tmp_path):
    path = tmp_path / "kernel_ratios.json"

    def write(*entries):
        rows = [{"gpu": "NVIDIA H200", "dtype": BF16, "fused": False, **e} for e in entries]
        path.write_text(json.dumps(kernel_ratios.document(rows)))
        kernel_ratios.forget()  # the file changed under the same knobs

    write()
    with knobs.symm.patch(KERNEL_RATIOS_FILE=str(path)):
        yield write


def _gemm(p):
    return model.plan_symm(H200, p).terms["gemm_ms"]


def test_ag_mm_kernel_time_follows_the_measured_ratio(ratios):
    p = Problem("ag_mm", m=8192, n=3584, k=4096, dtype=BF16, ws=4)
    with knobs.symm.patch(AG_MM_GEMM="triton"):  # the consumer kernel's plan
        fitted = _gemm(p)
        ratios({"kernel": "ag_mm", "ws": 4, "M": 8192, "K": 4096, "N": 3584, "ratio": 1.30})
        slow = _gemm(p)
    cublas = model.gemm_ms(H200, 8192, 3584, 4096, BF16)
    assert slow == pytest.approx(model.gemm_ms(H200, 8192, 3584, 4096, BF16, 1.30))
    assert slow > fitted > cublas


def test_mm_rs_follows_the_runtime_onto_cublas_and_the_kernel_ratio_elsewhere(ratios):
    p = Problem("mm_rs", m=4096, n=8192, k=1792, dtype=BF16, ws=4)  # K below RS_CUBLAS_MIN_K: the kernel
    kernel_fitted = _gemm(p)
    assert kernel_fitted == pytest.approx(model.gemm_ms(H200, 4096, 8192, 1792, BF16, knobs.cost.TRITON_EFF))
    ratios({"kernel": "mm_rs", "ws": 4, "M": 4096, "K": 1792, "N": 8192, "ratio": 1.02})
    assert _gemm(p) == pytest.approx(model.gemm_ms(H200, 4096, 8192, 1792, BF16, 1.02))
    ratios({"kernel": "mm_rs", "ws": 4, "M": 4096, "K": 1792, "N": 8192, "ratio": 1.26})
    assert model._rs_on_cublas(p, H200)
    assert _gemm(p) == pytest.approx(model.gemm_ms(H200, 4096, 8192, 1792, BF16))  # cuBLAS's own time


def test_the_cublas_paths_are_priced_at_their_measured_ratios(ratios):
    """Where the runtime takes cuBLAS and bench_kernels measured that path against one GEMM (``*_cublas``: its
    GEMMs per chunk or band and the partials' sum), the model prices it at that ratio; cuBLAS's own time where not
    measured."""
    ag = Problem("ag_mm", m=8192, n=3584, k=4096, dtype=BF16, ws=4)
    with knobs.symm.patch(AG_MM_GEMM="cublas"):
        assert model._ag_on_cublas(ag, H200)
        chunks = _gemm(ag)
        assert chunks == pytest.approx(4 * model.gemm_ms(H200, 2048, 3584, 4096, BF16))
        ratios({"kernel": "ag_mm_cublas", "ws": 4, "M": 8192, "K": 4096, "N": 3584, "ratio": 1.08})
        assert _gemm(ag) == pytest.approx(1.08 * model.gemm_ms(H200, 8192, 3584, 4096, BF16))
    rs = Problem("mm_rs", m=4096, n=8192, k=1792, dtype=BF16, ws=4)
    ratios({"kernel": "mm_rs", "ws": 4, "M": 4096, "K": 1792, "N": 8192, "ratio": 1.26})
    assert model._rs_on_cublas(rs, H200)

    def rs_device_ms_without_the_sum(terms):
        g, x, nb = terms["gemm_ms"], terms["transfer_ms"], model.bands(4096 // 4)
        return knobs.cost.SYMM_DEVICE_MS + max(g, g / (4 * nb) + x)

    unmeasured = model.plan_symm(H200, rs).terms
    assert unmeasured["device_ms"] > rs_device_ms_without_the_sum(unmeasured)  # the partials' sum priced apart
    ratios({"kernel": "mm_rs", "ws": 4, "M": 4096, "K": 1792, "N": 8192, "ratio": 1.26},
           {"kernel": "mm_rs_cublas", "ws": 4, "M": 4096, "K": 1792, "N": 8192, "ratio": 1.1})
    measured = model.plan_symm(H200, rs).terms
    assert measured["gemm_ms"] == pytest.approx(model.gemm_ms(H200, 4096, 8192, 1792, BF16, 1.1))
    assert measured["device_ms"] == pytest.approx(rs_device_ms_without_the_sum(measured))  # the ratio holds it
    ar = Problem("mm_ar", m=8192, n=8192, k=7168, dtype=BF16, ws=4)
    ratios({"kernel": "mm_ar", "ws": 4, "M": 8192, "K": 7168, "N": 8192, "ratio": 1.2})
    assert model._ar_on_cublas(ar, H200)
    assert _gemm(ar) == pytest.approx(model.gemm_ms(H200, 8192, 8192, 7168, BF16))
    ratios({"kernel": "mm_ar", "ws": 4, "M": 8192, "K": 7168, "N": 8192, "ratio": 1.2},
           {"kernel": "mm_ar_cublas", "ws": 4, "M": 8192, "K": 7168, "N": 8192, "ratio": 1.05})
    assert _gemm(ar) == pytest.approx(model.gemm_ms(H200, 8192, 8192, 7168, BF16, 1.05))


def test_mm_ar_rounds_and_cta_stages_read_their_ratios(ratios):
    p = Problem("mm_ar", m=8192, n=8192, k=7168, dtype=BF16, ws=4)
    ratios({"kernel": "mm_ar", "ws": 4, "M": 8192, "K": 7168, "N": 8192, "ratio": 1.01})
    assert _gemm(p) == pytest.approx(model.gemm_ms(H200, 8192, 8192, 7168, BF16, 1.01))
    cta = Problem("cta_pipeline_mlp", m=1024, n=8192, k=8192, dtype=BF16, ws=4, f=28672 // 4, activation="gelu")
    with knobs.cta.patch(STAGE0_GEMM="triton", STAGE1_GEMM="triton"):  # the kernels' ratios price the kernels
        fitted = model.plan_symm(H200, cta).terms["stage_ms"]
        # stage 0 is measured with its fused GELU (bench_kernels writes it "fused"): an unfused entry is not its ratio
        ratios({"kernel": "cta_stage0", "ws": 4, "M": 1024, "K": 8192, "N": 14336, "ratio": 3.0},
               {"kernel": "cta_stage1", "ws": 4, "M": 1024, "K": 28672, "N": 4096, "ratio": 1.5})
        assert model._cta_eff(H200, cta, 2, 28672, 1) == pytest.approx((knobs.cost.CTA_EFF + 1.5) / 2)
        ratios({"kernel": "cta_stage0", "ws": 4, "M": 1024, "K": 8192, "N": 14336, "ratio": 1.5, "fused": True},
               {"kernel": "cta_stage1", "ws": 4, "M": 1024, "K": 28672, "N": 4096, "ratio": 1.5})
        assert model._cta_eff(H200, cta, 2, 28672, 1) == pytest.approx(1.5)
        assert model.plan_symm(H200, cta).terms["stage_ms"] > fitted
    # by default ("auto") the kernels stay where their cuBLAS forms were not measured
    assert model._cta_eff(H200, cta, 2, 28672, 1) == pytest.approx(1.5)


def test_packaged_cta_stage0_ratio_is_found():
    """The benchmark of record's stage-0 entries (fused GELU-tanh) price the H200's CTA stages."""
    kernel_ratios.forget()
    cta = Problem("cta_pipeline_mlp", m=1024, n=8192, k=8192, dtype=BF16, ws=2, f=28672 // 2, activation="gelu")
    r0 = model.kernel_eff(H200, "cta_stage0", 1024, 8192, 28672, 2, BF16, fused=True)
    r1 = model.kernel_eff(H200, "cta_stage1", 1024, 28672, 8192, 2, BF16)
    assert r0 == pytest.approx(1.101, abs=1e-3) and r1 == pytest.approx(1.098, abs=1e-3)
    with knobs.cta.patch(STAGE0_GEMM="triton", STAGE1_GEMM="triton"):
        assert model._cta_eff(H200, cta, 1, 28672, 1) == pytest.approx((r0 + r1) / 2)
    # by default stage 1 takes its cuBLAS form there, measured faster (1.061) than its kernel; stage 0's is slower
    form1 = model.kernel_eff(H200, "cta_stage1_cublas", 1024, 28672, 8192, 2, BF16)
    assert form1 == pytest.approx(1.061, abs=1e-3)
    assert model._cta_eff(H200, cta, 1, 28672, 1) == pytest.approx((r0 + form1) / 2)


def _best(p, **kw):
    return model.predict(p, H200, ("symm",), **kw).best


def test_mm_ar_oneshot_sum_priced_by_its_form(ratios):
    """The one-shot sum: torch.sum's price where the runtime sums with torch, the kernel's measured ratio
    times it where it keeps the kernel; so a changed ratio moves the kernel form's prediction only."""
    p = Problem("mm_ar", m=128, n=8192, k=7168, dtype=BF16, ws=4)
    ratios({"kernel": "oneshot", "ws": 4, "M": 128, "K": 1, "N": 8192, "ratio": 2.0})
    auto = _best(p)
    assert auto.terms["torch_sum"] == 1.0 and auto.terms["sum_ratio"] == 1.0
    with knobs.symm.patch(ONESHOT_SUM="triton"):
        kernel = _best(p)
        assert kernel.terms["torch_sum"] == 0.0
        assert kernel.terms["sum_ms"] == pytest.approx(2.0 * auto.terms["sum_ms"])
        assert kernel.ms > auto.ms
        ratios({"kernel": "oneshot", "ws": 4, "M": 128, "K": 1, "N": 8192, "ratio": 3.0})
        assert _best(p).ms > kernel.ms
    assert _best(p).ms == pytest.approx(auto.ms)  # (torch: the ratio does not enter)
    ratios({"kernel": "oneshot", "ws": 4, "M": 128, "K": 1, "N": 8192, "ratio": 1.0})
    assert _best(p).terms["torch_sum"] == 0.0  # the kernel no longer loses: auto keeps it, at its ratio


def test_ag_mm_of_several_weights_reads_the_ratio_of_all_its_columns(ratios):
    """ag_gemm and bench_kernels take N as every weight's columns together (one kernel computes them all)."""
    p = Problem("ag_mm", m=8192, n=3 * 1024, k=4096, dtype=BF16, ws=4, gemms=3)
    ratios({"kernel": "ag_mm", "ws": 4, "M": 8192, "K": 4096, "N": 3072, "ratio": 1.2})
    with knobs.symm.patch(AG_MM_GEMM="triton"):
        assert _best(p).terms["gemm_ratio"] == pytest.approx(1.2)
        ratios({"kernel": "ag_mm", "ws": 4, "M": 8192, "K": 4096, "N": 3072, "ratio": 1.1})
        assert _best(p).terms["gemm_ratio"] == pytest.approx(1.1)


def test_every_priced_gemm_follows_its_ratio(ratios):
    """Where the runtime takes the Triton kernel, a worse measured ratio makes a slower prediction; where it
    takes cuBLAS (the kernel measured over the threshold), the prediction is cuBLAS's whatever the ratio."""
    cases = [
        (Problem("mm_rs", m=4096, n=8192, k=1792, dtype=BF16, ws=4), {"kernel": "mm_rs", "M": 4096, "K": 1792, "N": 8192}),
        (Problem("mm_ar", m=8192, n=8192, k=7168, dtype=BF16, ws=4), {"kernel": "mm_ar", "M": 8192, "K": 7168, "N": 8192}),
        (Problem("cta_pipeline_mlp", m=4096, n=8192, k=8192, dtype=BF16, ws=4, f=28672 // 4, activation="gelu"),
         {"kernel": "cta_stage1", "M": 4096, "K": 28672, "N": 4096}),
    ]
    for p, entry in cases:
        ratios({"ws": 4, **entry, "ratio": 1.0})
        fast = _best(p).terms["device_ms"]
        ratios({"ws": 4, **entry, "ratio": 1.02})
        slow = _best(p).terms["device_ms"]
        assert slow > fast, p.op
    p, entry = cases[0]
    ratios({"ws": 4, **entry, "ratio": 1.5})
    on_cublas = _best(p)
    ratios({"ws": 4, **entry, "ratio": 2.5})
    assert _best(p).terms["device_ms"] == pytest.approx(on_cublas.terms["device_ms"])
    assert on_cublas.terms["cublas_gemms"] == 1.0


def test_cta_and_moe_gemm_knobs_price_cublas_where_set(ratios):
    """knobs.cta.STAGE0_GEMM / STAGE1_GEMM and knobs.moe.EXPERT_GEMM, decided by the runtime's own functions:
    a stage on cuBLAS is priced at its form's measured ratio (1 where not measured), the experts on
    torch._grouped_mm as the plain graph's grouped GEMMs."""
    cta = Problem("cta_pipeline_mlp", m=1024, n=8192, k=8192, dtype=BF16, ws=4, f=28672 // 4, activation="gelu")
    ratios({"kernel": "cta_stage0", "ws": 4, "M": 1024, "K": 8192, "N": 14336, "ratio": 1.5, "fused": True},
           {"kernel": "cta_stage1", "ws": 4, "M": 1024, "K": 28672, "N": 4096, "ratio": 1.3})
    with knobs.cta.patch(STAGE0_GEMM="triton", STAGE1_GEMM="triton"):
        assert model._cta_eff(H200, cta, 2, 28672, 1) == pytest.approx(1.4)
    with knobs.cta.patch(STAGE0_GEMM="cublas", STAGE1_GEMM="triton"):
        assert model._cta_eff(H200, cta, 2, 28672, 1) == pytest.approx(1.15)
    with knobs.cta.patch(STAGE0_GEMM="auto", STAGE1_GEMM="auto"):  # over CUBLAS_ABOVE_RATIO, forms not measured
        assert model._cta_eff(H200, cta, 2, 28672, 1) == pytest.approx(1.4)
    # the cuBLAS forms measured (bench_kernels' cta_stage<i>_cublas): priced at their own ratios; auto takes
    # the form only where it beats the kernel (stage 0: 1.2 < 1.5; stage 1: 1.35 > 1.3, the kernel stays)
    ratios({"kernel": "cta_stage0", "ws": 4, "M": 1024, "K": 8192, "N": 14336, "ratio": 1.5, "fused": True},
           {"kernel": "cta_stage1", "ws": 4, "M": 1024, "K": 28672, "N": 4096, "ratio": 1.3},
           {"kernel": "cta_stage0_cublas", "ws": 4, "M": 1024, "K": 8192, "N": 14336, "ratio": 1.2, "fused": True},
           {"kernel": "cta_stage1_cublas", "ws": 4, "M": 1024, "K": 28672, "N": 4096, "ratio": 1.35})
    with knobs.cta.patch(STAGE0_GEMM="cublas", STAGE1_GEMM="cublas"):
        assert model._cta_eff(H200, cta, 2, 28672, 1) == pytest.approx((1.2 + 1.35) / 2)
    with knobs.cta.patch(STAGE0_GEMM="auto", STAGE1_GEMM="auto"):
        assert model._cta_eff(H200, cta, 2, 28672, 1) == pytest.approx((1.2 + 1.3) / 2)
    moe = Problem("moe_experts", m=8192, n=4096, k=4096, dtype=BF16, ws=4, f=14336, experts=2, rows_sent=8192)
    with knobs.moe.patch(EXPERT_GEMM="triton"):
        kernel = _best(moe, comm_sms=0)
    with knobs.moe.patch(EXPERT_GEMM="grouped_mm"):
        grouped = _best(moe, comm_sms=0)
    assert grouped.terms["cublas_gemms"] == 1.0 and kernel.terms["cublas_gemms"] == 0.0
    assert grouped.terms["gemm_ms"] == pytest.approx(
        model._experts_ms(H200, moe, moe.m, compute_eff=knobs.cost.BASE_GROUPED_EFF))
