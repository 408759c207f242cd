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


def test_mm_ar_rounds_and_cta_stages_read_their_ratios(ratios):
    p = Problem("mm_ar", m=8192, n=8192, k=7168, dtype=BF16, ws=4)
    ratios({"kernel": "mm_ar", "ws": 4, "M": 8192, "K": 7168, "N": 8192, "ratio": 1.01})
    assert _gemm(p) == pytest.approx(model.gemm_ms(H200, 8192, 8192, 7168, BF16, 1.01))
    cta = Problem("cta_pipeline_mlp", m=1024, n=8192, k=8192, dtype=BF16, ws=4, f=28672 // 4, activation="gelu")
    fitted = model.plan_symm(H200, cta).terms["stage_ms"]
    ratios({"kernel": "cta_stage0", "ws": 4, "M": 1024, "K": 8192, "N": 14336, "ratio": 1.5},
           {"kernel": "cta_stage1", "ws": 4, "M": 1024, "K": 28672, "N": 4096, "ratio": 1.5})
    assert model._cta_eff(H200, cta, 2, 28672, 1) == pytest.approx(1.5)
    assert model.plan_symm(H200, cta).terms["stage_ms"] > fitted
