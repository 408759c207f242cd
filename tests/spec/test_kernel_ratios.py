"""The measured kernel/cuBLAS ratios (spec/kernel_ratios.py) and the GEMM choices of ag_mm, mm_rs and
mm_ar that read them: cuBLAS where the kernel measured slower than the threshold at the nearest
measured shape of this GPU, the shape rules where nothing was measured near."""

from __future__ import annotations

import json

import pytest
import torch

from overlap_backend.runtime.symm import ag_mm as symm_ag_mm
from overlap_backend.runtime.symm import mm_ar as symm_mm_ar
from overlap_backend.runtime.symm import mm_rs as symm_mm_rs
from overlap_backend.spec import kernel_ratios, knobs

from ratio_files import GPU
from ratio_files import entry as _entry


def test_nearest_entry_of_this_gpu_kernel_dtype_and_epilogue(ratios):
    ratios(_entry("mm_rs", 4, 4096, 1792, 8192, 1.26), _entry("mm_rs", 4, 16384, 512, 8192, 1.38),
           _entry("mm_rs", 4, 4096, 1792, 8192, 0.9, gpu="Other GPU"), _entry("mm_rs", 4, 4096, 1792, 8192, 0.8,
                                                                               dtype="float16"),
           _entry("ag_mm", 4, 4096, 1792, 8192, 1.5, fused=True))
    assert kernel_ratios.measured_ratio("mm_rs", 4096, 1792, 8192, ws=4) == 1.26
    assert kernel_ratios.measured_ratio("mm_rs", 5000, 1792, 8192, ws=4) == 1.26  # nearest, within the distance
    assert kernel_ratios.measured_ratio("mm_rs", 16384, 600, 8192, ws=4) == 1.38
    assert kernel_ratios.measured_ratio("mm_rs", 4096, 1792, 8192, ws=4, gpu="Other GPU") == 0.9
    assert kernel_ratios.measured_ratio("mm_rs", 4096, 1792, 8192, ws=4, dtype="torch.float16") == 0.8
    assert kernel_ratios.measured_ratio("mm_rs", 4096, 1792, 8192, ws=4, dtype="float32") is None
    assert kernel_ratios.measured_ratio("ag_mm", 4096, 1792, 8192, ws=4) is None  # only a fused entry
    assert kernel_ratios.measured_ratio("ag_mm", 4096, 1792, 8192, ws=4, fused=True) == 1.5
    assert kernel_ratios.measured_ratio("mm_rs", 4096, 7168, 8192, ws=4) is None  # 2 octaves of K away
    assert kernel_ratios.measured_ratio("mm_rs", 4096, 1792, 8192, ws=8) == 1.26  # one octave of ws
    with knobs.symm.patch(KERNEL_RATIO_MAX_DISTANCE=0.5):
        assert kernel_ratios.measured_ratio("mm_rs", 4096, 1792, 8192, ws=8) is None
    assert kernel_ratios.kernel_loses("mm_rs", 4096, 1792, 8192, ws=4) is True
    with knobs.symm.patch(CUBLAS_ABOVE_RATIO=1.3):
        assert kernel_ratios.kernel_loses("mm_rs", 4096, 1792, 8192, ws=4) is False
    with knobs.symm.patch(CUBLAS_ABOVE_RATIO=None):
        assert kernel_ratios.kernel_loses("mm_rs", 4096, 1792, 8192, ws=4) is None


def test_missing_or_broken_files_measure_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_ratios, "gpu_name", lambda: GPU)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for path in (tmp_path / "missing.json", bad):
        with knobs.symm.patch(KERNEL_RATIOS_FILE=str(path)):
            assert kernel_ratios.entries() == [] and kernel_ratios.measured_ratio("mm_rs", 1, 1, 1) is None
    bad.write_text(json.dumps({"format": 1, "entries": [{"gpu": GPU, "kernel": "mm_rs", "ratio": 2.0}]}))
    with knobs.symm.patch(KERNEL_RATIOS_FILE=str(bad)):
        assert kernel_ratios.entries() == []  # an entry without its shape is left out


def test_without_cuda_nothing_is_measured():
    # (CI has no GPU: every decision keeps its shape rules, whatever the packaged file holds)
    assert kernel_ratios.gpu_name() is None
    assert kernel_ratios.measured_ratio("mm_rs", 4096, 1792, 8192, ws=4) is None


def test_packaged_file_reads():
    rows = kernel_ratios.entries(kernel_ratios.PACKAGED)
    assert rows and all(r["gpu"] and r["ratio"] > 0 for r in rows)


def test_rs_gemm_takes_cublas_where_the_kernel_measured_slower(ratios):
    ratios(_entry("mm_rs", 4, 4096, 1792, 8192, 1.26), _entry("mm_rs", 4, 4096, 7168, 8192, 1.01))
    # K=1792 is below RS_CUBLAS_MIN_K: the shape rule alone takes the kernel
    assert symm_mm_rs.rs_gemm(1, 1024, 1792) == "triton"
    assert symm_mm_rs.rs_gemm(1, 1024, 1792, N=8192, ws=4) == "cublas"
    assert symm_mm_rs.rs_gemm(1, 1024, 7168, N=8192, ws=4) == "cublas"  # within 1.03: the rules (cuBLAS here)
    assert symm_mm_rs.rs_gemm(1, 1024, 1792, "peer", N=8192, ws=4) == "triton"  # peer stores are the kernel's
    assert symm_mm_rs.rs_gemm(8, 64, 1792, N=8192, ws=4) == "triton"  # runs too short for per-run GEMMs
    with knobs.symm.patch(MM_RS_GEMM="triton"):
        assert symm_mm_rs.rs_gemm(1, 1024, 1792, N=8192, ws=4) == "triton"
    assert symm_mm_rs.rs_gemm(1, 1024, 1024, N=1024, ws=4) == "triton"  # never measured near: the rules


def test_ar_gemm_takes_cublas_where_the_rounds_kernel_measured_slower(ratios):
    ratios(_entry("mm_ar", 2, 4096, 7168, 8192, 1.2), _entry("mm_rs", 2, 1024, 1024, 8192, 1.3))
    assert symm_mm_ar.ar_gemm(4096, 7168, 2) == "triton"  # rounds: the rule takes the kernel
    assert symm_mm_ar.ar_gemm(4096, 7168, 2, N=8192) == "cublas"
    assert symm_mm_ar.ar_gemm(4096, 7168, 2, "peer", N=8192) == "triton"
    # one round, not measured as mm_ar: the mm_rs kernel's ratio near it stands in
    assert symm_mm_ar.ar_gemm(1024, 1024, 2) == "triton" and symm_mm_ar.ar_gemm(1024, 1024, 2, N=8192) == "cublas"


def test_measured_cublas_paths_slower_than_their_kernel_keep_the_kernel(ratios):
    """Where an op's cuBLAS path was measured too (bench_kernels' "<kernel>_cublas" rows: its per-band or
    per-round GEMMs and flags against one GEMM), the op takes it only where it beats the losing kernel."""
    ratios(_entry("mm_rs", 4, 4096, 1792, 8192, 1.26), _entry("mm_rs_cublas", 4, 4096, 1792, 8192, 1.31),
           _entry("mm_rs", 4, 16384, 512, 8192, 1.38), _entry("mm_rs_cublas", 4, 16384, 512, 8192, 1.02),
           _entry("mm_ar", 2, 4096, 7168, 8192, 1.2), _entry("mm_ar_cublas", 2, 4096, 7168, 8192, 1.25),
           _entry("mm_ar", 2, 1024, 7168, 8192, 1.2), _entry("mm_ar_cublas", 2, 1024, 7168, 8192, 1.1),
           _entry("ag_mm", 4, 16384, 8192, 512, 1.127, fused=True), _entry("ag_mm", 4, 16384, 8192, 2048, 1.2),
           _entry("ag_mm_cublas", 4, 16384, 8192, 2048, 1.3))
    choice = kernel_ratios.measured_choice
    assert choice("mm_rs", 4096, 1792, 8192, ws=4) == "triton"
    assert choice("mm_rs", 16384, 512, 8192, ws=4) == "cublas"
    assert choice("mm_rs", 4096, 1792, 8192, ws=4, path="mm_rs_elsewhere") == "cublas"  # the path not measured
    with knobs.symm.patch(CUBLAS_ABOVE_RATIO=1.3):  # the kernel within the threshold
        assert choice("mm_rs", 4096, 1792, 8192, ws=4) == "triton"  # and its path measured slower
        assert choice("mm_rs", 4096, 1792, 8192, ws=4, path="mm_rs_elsewhere") is None  # not measured: the rules
    with knobs.symm.patch(CUBLAS_ABOVE_RATIO=1.4):
        assert choice("mm_rs", 16384, 512, 8192, ws=4) is None  # the path faster: the rules
    with knobs.symm.patch(CUBLAS_ABOVE_RATIO=None):
        assert choice("mm_rs", 16384, 512, 8192, ws=4) is None
    assert symm_mm_rs.rs_gemm(1, 1024, 1792, N=8192, ws=4) == "triton"
    assert symm_mm_rs.rs_gemm(1, 4096, 512, N=8192, ws=4) == "cublas"
    assert symm_mm_ar.ar_gemm(4096, 7168, 2, N=8192) == "triton"
    assert symm_mm_ar.ar_gemm(1024, 7168, 2, N=8192) == "cublas"
    assert symm_ag_mm.ag_gemm(1, 4096, 8192, 512, epilogue=True, ws=4) == "cublas"  # no path measured near it
    with knobs.symm.patch(AG_CUBLAS_MIN_N=4096):
        assert symm_ag_mm.ag_gemm(1, 4096, 8192, 2048, ws=4) == "triton"


def test_a_fused_gemm_reads_its_paths_plain_ratio_where_only_that_was_measured(ratios):
    """A fused epilogue runs apart on the cuBLAS path, as on the baseline: the path's plain ratio bounds its fused
    one, so a fused kernel faster than that stays (measured on an H200: the fused kernel 1.08, the path 1.19)."""
    ratios(_entry("ag_mm", 4, 8192, 4096, 3584, 1.082, fused=True), _entry("ag_mm_cublas", 4, 8192, 4096, 3584, 1.188),
           _entry("ag_mm", 2, 8192, 4096, 7168, 1.083, fused=True), _entry("ag_mm_cublas", 2, 8192, 4096, 7168, 1.009))
    choice = kernel_ratios.measured_choice
    assert choice("ag_mm", 8192, 4096, 3584, ws=4, fused=True) == "triton"
    assert choice("ag_mm", 8192, 4096, 7168, ws=2, fused=True) == "cublas"
    assert symm_ag_mm.ag_gemm(1, 2048, 4096, 3584, epilogue=True, ws=4) == "triton"
    assert symm_ag_mm.ag_gemm(1, 4096, 4096, 7168, epilogue=True, ws=2) == "cublas"
    ratios(_entry("ag_mm", 4, 8192, 4096, 3584, 1.082, fused=True), _entry("ag_mm_cublas", 4, 8192, 4096, 3584, 1.05),
           _entry("ag_mm_cublas", 4, 8192, 4096, 3584, 1.2, fused=True))
    assert choice("ag_mm", 8192, 4096, 3584, ws=4, fused=True) == "triton"  # the fused path's own ratio first


def test_ag_gemm_keeps_a_kernel_at_cublas_speed_where_the_chunked_path_measured_slower(ratios):
    """Plain ag_mm takes its cuBLAS path by rule (a GEMM per chunk); at decode sizes each of those GEMMs reads the
    whole weight, so where that path measured slower than a kernel within the threshold, the kernel stays."""
    ratios(_entry("ag_mm", 8, 512, 8192, 7168, 1.02), _entry("ag_mm_cublas", 8, 512, 8192, 7168, 3.1),
           _entry("ag_mm", 8, 8192, 8192, 7168, 1.02), _entry("ag_mm_cublas", 8, 8192, 8192, 7168, 1.01))
    assert symm_ag_mm.ag_gemm(1, 64, 8192, 7168, ws=8) == "triton"
    assert symm_ag_mm.ag_gemm(1, 1024, 8192, 7168, ws=8) == "cublas"  # the path as fast: the rule
    assert symm_ag_mm.ag_gemm(1, 64, 8192, 7168) == "cublas"  # no ws, nothing looked up: the rule
    assert symm_ag_mm.ag_gemm(1, 64, 8192, 7168, ws=8, gpu="Other GPU") == "cublas"


def test_ag_gemm_takes_cublas_where_the_fused_kernel_measured_slower(ratios):
    ratios(_entry("ag_mm", 4, 16384, 8192, 512, 1.127, fused=True), _entry("ag_mm", 4, 8192, 4096, 3584, 1.02,
                                                                           fused=True),
           _entry("ag_mm", 4, 16384, 8192, 2048, 1.2))
    assert symm_ag_mm.ag_gemm(1, 4096, 8192, 512, epilogue=True) == "triton"  # no ws: the rule
    assert symm_ag_mm.ag_gemm(1, 4096, 8192, 512, epilogue=True, ws=4) == "cublas"
    assert symm_ag_mm.ag_gemm(1, 2048, 4096, 3584, epilogue=True, ws=4) == "triton"  # fused within 1.03
    assert symm_ag_mm.ag_gemm(4, 64, 8192, 512, epilogue=True, ws=4) == "triton"  # runs of 64 rows
    with knobs.symm.patch(AG_CUBLAS_MIN_N=4096):  # the rule says kernel, the measurement says cuBLAS
        assert symm_ag_mm.ag_gemm(1, 4096, 8192, 2048, ws=4) == "cublas"
        assert symm_ag_mm.ag_gemm(1, 4096, 8192, 2048) == "triton"
    with knobs.symm.patch(AG_MM_GEMM="triton"):
        assert symm_ag_mm.ag_gemm(1, 4096, 8192, 512, epilogue=True, ws=4) == "triton"


def test_ag_mm_runs_its_epilogue_apart_where_that_measured_faster_than_fused(ratios):
    """fuses_epilogue / ag_epilogue_apart: the kernel plain with the epilogue after it (``apart_ratio``, over the same
    baseline as the fused ``ratio``) where that measured faster by knobs.symm.EPILOGUE_APART_GAIN; fused where it
    did not, or was not measured near."""
    apart = {**_entry("ag_mm", 4, 8192, 4096, 3584, 1.094, fused=True), "apart_ratio": 1.042}
    close = {**_entry("ag_mm", 4, 8192, 4096, 28672, 1.05, fused=True), "apart_ratio": 1.045}
    ratios(apart, close, _entry("ag_mm", 4, 16384, 8192, 512, 1.02, fused=True),
           _entry("ag_mm", 4, 8192, 4096, 3584, 1.03))
    assert kernel_ratios.fuses_epilogue("ag_mm", 8192, 4096, 3584, ws=4) is False
    assert symm_ag_mm.ag_epilogue_apart(1, 2048, 4096, 3584, ws=4) is True
    assert symm_ag_mm.ag_epilogue_apart(1, 2048, 4096, 28672, ws=4) is False  # 0.5 % faster: under the gain
    assert kernel_ratios.fuses_epilogue("ag_mm", 8192, 4096, 28672, ws=4) is True
    assert kernel_ratios.fuses_epilogue("ag_mm", 16384, 8192, 512, ws=4) is None  # apart not measured
    assert symm_ag_mm.ag_epilogue_apart(1, 4096, 8192, 512, ws=4) is False
    assert kernel_ratios.fuses_epilogue("ag_mm", 1024, 1024, 1024, ws=4) is None  # nothing near
    assert symm_ag_mm.ag_epilogue_apart(1, 2048, 4096, 3584, ws=0) is False  # no group: the rule (fused)
    with knobs.symm.patch(EPILOGUE_APART_GAIN=None):
        assert symm_ag_mm.ag_epilogue_apart(1, 2048, 4096, 3584, ws=4) is False
    with knobs.symm.patch(EPILOGUE_APART_GAIN=0.1):
        assert symm_ag_mm.ag_epilogue_apart(1, 2048, 4096, 3584, ws=4) is False  # 4.8 % faster: under 10 %


def test_oneshot_sum_takes_torch_where_the_sum_kernel_measured_slower(ratios):
    """mm_ar one-shot (knobs.symm.ONESHOT_SUM): "auto" sums with torch where the one-shot kernel measured
    slower than torch.sum near the shape (entries with K = 1), the kernel elsewhere; a generated epilogue
    keeps the kernel whatever the knob says; "triton" / "torch" force the form."""
    ratios(_entry("oneshot", 4, 128, 1, 8192, 1.84), _entry("oneshot", 2, 8, 1, 4096, 0.9))
    sums = symm_mm_ar.oneshot_sum
    assert sums(128, 8192, 4) == "torch" and sums(160, 8192, 4) == "torch"  # near the measured shape
    assert sums(8, 4096, 2) == "triton"  # measured faster there
    assert sums(1024, 1024, 4) == "triton"  # nothing measured near: the kernel
    assert sums(128, 8192, 4, epilogue=True) == "triton"
    assert sums(128, 8192, 4, gpu="Other GPU") == "triton"
    with knobs.symm.patch(ONESHOT_SUM="triton"):
        assert sums(128, 8192, 4) == "triton"
    with knobs.symm.patch(ONESHOT_SUM="torch"):
        assert sums(1024, 1024, 4) == "torch" and sums(8, 4096, 2) == "torch"
        assert sums(128, 8192, 4, epilogue=True) == "triton"
    with knobs.symm.patch(CUBLAS_ABOVE_RATIO=2.0):
        assert sums(128, 8192, 4) == "triton"
    with knobs.symm.patch(ONESHOT_SUM="cuda"), pytest.raises(ValueError, match="ONESHOT_SUM"):
        sums(128, 8192, 4)


def test_oneshot_sum_of_the_packaged_ratios():
    """The kernel benchmark of record (bench/results/kernels_h200x1_2026-12-06/record): the one-shot kernel took
    1.24x and 1.64x torch.sum at 8x4096 with ws 4 and 8, so "auto" sums with torch there on an H200, and
    0.61-1.03x at the other four shapes, where the kernel stays."""
    kernel_ratios.forget()
    for ws, M, N in ((4, 8, 4096), (8, 8, 4096)):
        assert symm_mm_ar.oneshot_sum(M, N, ws, gpu="NVIDIA H200") == "torch", (ws, M, N)
    for ws, M, N in ((2, 128, 8192), (2, 8, 4096), (4, 128, 8192), (8, 128, 8192)):
        assert symm_mm_ar.oneshot_sum(M, N, ws, gpu="NVIDIA H200") == "triton", (ws, M, N)


def _with_variant(kernel, ws, M, K, N, ratio, best, config=(128, 256, 64, 8, 4, 8, "tma_subtile_flatten")):
    return {**_entry(kernel, ws, M, K, N, ratio), "config": [128, 256, 64, 8, 3, 8, False],
            "best_variant_ratio": best, "best_config": list(config)}


def test_the_ops_tune_over_a_variant_that_won_by_the_gain_and_read_its_ratio(ratios):
    """Where the benchmark's best bench-only variant beat the op's candidates by MEASURED_VARIANT_GAIN, ag_mm /
    mm_rs / mm_ar add it to their tuning candidates, and their choices read its ratio (1.02: no cuBLAS path)."""
    ratios(_with_variant("ag_mm", 4, 8192, 8192, 14336, 1.05, 1.02),
           _with_variant("mm_rs", 4, 8192, 3584, 4096, 1.137, 1.133),  # within 1%: noise, not taken
           _with_variant("cta_stage0", 4, 512, 8192, 14336, 1.2, 1.0),  # the CTA op tunes no such variant
           _entry("ag_mm_cublas", 4, 8192, 8192, 14336, 1.034))
    assert kernel_ratios.measured_variant("ag_mm", 8192, 8192, 14336, ws=4) == (128, 256, 64, 8, 4, 8,
                                                                                 "tma_subtile_flatten")
    assert kernel_ratios.measured_ratio("ag_mm", 8192, 8192, 14336, ws=4) == 1.02
    assert symm_ag_mm.ag_gemm(1, 2048, 8192, 14336, ws=4) == "triton"  # 1.02 < the path's 1.034
    assert kernel_ratios.measured_variant("mm_rs", 8192, 3584, 4096, ws=4) is None
    assert kernel_ratios.measured_ratio("mm_rs", 8192, 3584, 4096, ws=4) == 1.137
    assert kernel_ratios.measured_variant("cta_stage0", 512, 8192, 14336, ws=4) is None
    assert kernel_ratios.measured_ratio("cta_stage0", 512, 8192, 14336, ws=4) == 1.2
    with knobs.codegen.patch(MEASURED_VARIANT_GAIN=None):
        assert kernel_ratios.measured_variant("ag_mm", 8192, 8192, 14336, ws=4) is None
        assert kernel_ratios.measured_ratio("ag_mm", 8192, 8192, 14336, ws=4) == 1.05
        assert symm_ag_mm.ag_gemm(1, 2048, 8192, 14336, ws=4) == "cublas"
    with knobs.codegen.patch(MEASURED_VARIANT_GAIN=0.001):
        assert kernel_ratios.measured_variant("mm_rs", 8192, 3584, 4096, ws=4) == (128, 256, 64, 8, 4, 8,
                                                                                   "tma_subtile_flatten")


def test_the_moe_down_gemm_tunes_over_its_measured_gluon_form(ratios):
    """The MoE down GEMM adopts a faster bench variant as the collective GEMMs do (its Gluon forms are such variants):
    its ratio and kernel time (which the MoE form's choice compares, moe_grouped.form_faster) are the variant's."""
    gluon = (128, 256, 64, 8, 3, 4, "ws_coop")
    ratios({**_with_variant("moe_down", 4, 32768, 2048, 7168, 1.12, 1.0, gluon), "kernel_ms": 1.68},
           _with_variant("moe_down", 4, 1024, 2048, 7168, 1.30, 1.295, gluon))  # within the gain: not taken
    assert kernel_ratios.measured_variant("moe_down", 32768, 2048, 7168, ws=4) == gluon
    assert kernel_ratios.measured_ratio("moe_down", 32768, 2048, 7168, ws=4) == 1.0
    e = kernel_ratios.nearest("moe_down", 32768, 2048, 7168, ws=4)
    assert kernel_ratios.kernel_ms(e) == pytest.approx(1.5)
    assert kernel_ratios.measured_variant("moe_down", 1024, 2048, 7168, ws=4) is None
    with knobs.codegen.patch(MEASURED_VARIANT_GAIN=None):
        assert kernel_ratios.kernel_ms(e) == 1.68


def test_cta_stage0_runs_the_gluon_form_measured_fastest_near_its_shape(ratios):
    """CTA stage 0 (knobs.cta.STAGE0_FORM "measured") asks for the Gluon form of the benchmark's fastest variant at
    the nearest shape where it beat the Triton kernel by the gain, never a Triton variant (other tiles, split-K runs
    the op does not take), and its ratio is the form's; a fixed form or None is taken as set."""
    from overlap_backend.runtime import cta_cublas

    coop, pingpong = [128, 256, 64, 8, 3, 4, "ws_coop", 1], [128, 128, 64, 8, 4, 4, "ws_pingpong", 1]
    narrow = [128, 128, 64, 8, 4, 8, True, 1]
    ratios({**_entry("cta_stage0", 4, 1024, 8192, 14336, 1.09, fused=True), "best_variant_ratio": 1.02,
            "best_config": narrow, "variants": [[narrow, 1.02], [pingpong, 1.06], [coop, 1.07]]},
           {**_entry("cta_stage0", 2, 4096, 8192, 28672, 1.04, fused=True), "best_variant_ratio": 1.002,
            "best_config": coop, "variants": [[coop, 1.002], [pingpong, 1.018]]},
           {**_entry("cta_stage0", 8, 512, 8192, 7168, 1.066, fused=True), "best_variant_ratio": 1.06,
            "best_config": coop, "variants": [[coop, 1.06]]})  # within the gain: the Triton kernel
    form = lambda M, H, Fp, ws: cta_cublas.stage0_kernel_form(M, H, Fp, ws, torch.bfloat16)  # noqa: E731
    assert form(1024, 8192, 14336, 4) == "ws_pingpong"  # the narrower Triton tiles are not the op's
    assert kernel_ratios.measured_ratio("cta_stage0", 1024, 8192, 14336, ws=4, fused=True) == 1.06
    assert form(4096, 8192, 28672, 2) == "ws_coop"
    assert form(512, 8192, 7168, 8) is None
    assert kernel_ratios.measured_ratio("cta_stage0", 512, 8192, 7168, ws=8, fused=True) == 1.066
    assert form(4096, 1024, 512, 2) is None, "nothing measured near"
    with knobs.cta.patch(STAGE0_FORM=None):
        assert form(4096, 8192, 28672, 2) is None
        assert kernel_ratios.measured_ratio("cta_stage0", 4096, 8192, 28672, ws=2, fused=True) == 1.04
    with knobs.cta.patch(STAGE0_FORM="ws_pingpong"):
        assert form(4096, 8192, 28672, 2) == "ws_pingpong" and form(4096, 1024, 512, 2) == "ws_pingpong"


def test_an_op_does_not_adopt_the_variants_named_not_adopted_for_its_kernel(ratios):
    """An op does not tune over a variant whose store field ``knobs.codegen.VARIANTS_NOT_ADOPTED`` names for its
    kernel, plain or fused (its ratio is not read either); the same store field of another kernel is adopted."""
    gluon = (128, 256, 64, 8, 3, 4, "ws_coop")
    ratios(_with_variant("ag_mm", 4, 8192, 4096, 3584, 1.01, 0.95, gluon),
           {**_with_variant("ag_mm", 4, 8192, 4096, 3584, 1.08, 0.99, gluon), "fused": True},
           _with_variant("mm_rs", 4, 8192, 3584, 4096, 1.10, 1.00, gluon))
    with knobs.codegen.patch(VARIANTS_NOT_ADOPTED={"ag_mm": ("ws_coop",)}):
        assert kernel_ratios.measured_variant("ag_mm", 8192, 4096, 3584, ws=4) is None
        assert kernel_ratios.measured_ratio("ag_mm", 8192, 4096, 3584, ws=4) == 1.01
        assert kernel_ratios.measured_variant("ag_mm", 8192, 4096, 3584, ws=4, fused=True) is None
        assert kernel_ratios.measured_ratio("ag_mm", 8192, 4096, 3584, ws=4, fused=True) == 1.08
        assert kernel_ratios.measured_variant("mm_rs", 8192, 3584, 4096, ws=4) == gluon
    with knobs.codegen.patch(VARIANTS_NOT_ADOPTED={}):
        assert kernel_ratios.measured_variant("moe_down", 32768, 2048, 7168, ws=4) is None  # not measured there
        assert kernel_ratios.measured_variant("ag_mm", 8192, 4096, 3584, ws=4) == gluon
        assert kernel_ratios.measured_variant("ag_mm", 8192, 4096, 3584, ws=4, fused=True) == gluon
        assert kernel_ratios.measured_ratio("ag_mm", 8192, 4096, 3584, ws=4, fused=True) == 0.99


@knobs.codegen.patch(VARIANTS_NOT_ADOPTED={"ag_mm": ("ws_coop",)})
def test_an_op_falls_back_on_the_next_variant_it_may_take(ratios):
    """Where the fastest variant is one the op may not take, it tunes over the next of ``variants`` that won by the
    gain (and reads its ratio); one that did not win is not taken."""
    gluon, flat = (128, 256, 64, 8, 3, 4, "ws_coop"), (128, 256, 64, 8, 4, 8, "tma_subtile_flatten")
    fused = {**_with_variant("ag_mm", 8, 8192, 4096, 1792, 1.08, 0.99, gluon), "fused": True,
             "variants": [[list(gluon), 0.99], [list(flat), 1.02], [[128, 128, 64, 8, 5, 8, True], 1.03]]}
    ratios(fused)
    assert kernel_ratios.measured_variant("ag_mm", 8192, 4096, 1792, ws=8, fused=True) == flat
    assert kernel_ratios.measured_ratio("ag_mm", 8192, 4096, 1792, ws=8, fused=True) == 1.02
    ratios({**fused, "variants": [[list(gluon), 0.99], [list(flat), 1.075]]})  # within the gain of 1.08
    assert kernel_ratios.measured_variant("ag_mm", 8192, 4096, 1792, ws=8, fused=True) is None
    assert kernel_ratios.measured_ratio("ag_mm", 8192, 4096, 1792, ws=8, fused=True) == 1.08


def test_a_malformed_best_config_is_no_variant(ratios):
    ratios({**_with_variant("ag_mm", 4, 8192, 8192, 14336, 1.05, 1.02), "best_config": None},
           {**_with_variant("mm_ar", 4, 4096, 7168, 8192, 1.1, 1.0), "best_config": [128, 256]})
    assert kernel_ratios.measured_variant("ag_mm", 8192, 8192, 14336, ws=4) is None
    assert kernel_ratios.measured_ratio("ag_mm", 8192, 8192, 14336, ws=4) == 1.05
    assert kernel_ratios.measured_variant("mm_ar", 4096, 7168, 8192, ws=4) is None


def test_reading_another_file_switches_and_forgets_both_ways(ratios, tmp_path):
    ratios(_entry("mm_rs", 4, 4096, 1792, 8192, 1.26))
    other = tmp_path / "other.json"
    other.write_text(json.dumps(kernel_ratios.document([_entry("mm_rs", 4, 4096, 1792, 8192, 1.5)])))
    assert kernel_ratios.measured_ratio("mm_rs", 4096, 1792, 8192, ws=4) == 1.26
    with kernel_ratios.reading(other):
        assert kernel_ratios.measured_ratio("mm_rs", 4096, 1792, 8192, ws=4) == 1.5
    assert kernel_ratios.measured_ratio("mm_rs", 4096, 1792, 8192, ws=4) == 1.26
    with pytest.raises(RuntimeError), kernel_ratios.reading(other):
        assert kernel_ratios.measured_choice("mm_rs", 4096, 1792, 8192, ws=4) == "cublas"
        raise RuntimeError("a run that fails half way")
    assert kernel_ratios.measured_choice("mm_rs", 4096, 1792, 8192, ws=4) == "cublas"  # 1.26 > 1.03, path unmeasured
    assert kernel_ratios.measured_ratio("mm_rs", 4096, 1792, 8192, ws=4) == 1.26
