"""Measured kernel/cuBLAS time ratios of the op kernels' GEMMs, per GPU, kernel and local shape.

``bench/suites/bench_kernels.py`` measures every GEMM kernel the ops run alone on one GPU (flags
raised, no communication) against cuBLAS on the same GEMM, and writes this file's format
(``kernel_ratios.json`` in its output folder; the package's copy is ``spec/kernel_ratios.json``).
The runtime's GEMM choices (``runtime/symm``: ``ag_gemm``, ``rs_gemm``, ``ar_gemm``; the CTA stages' forms)
read it through :func:`measured_choice`, the cost model through :func:`measured_ratio`: a decision depends
only on the shape, the dtype, the GPU's name and this file, so every rank of a group on one node decides alike.

An entry: ``{"gpu", "kernel", "dtype", "ws", "M", "K", "N", "fused", "ratio", ...}`` where ``M, K, N``
is the kernel's local GEMM (``mm_rs`` / ``mm_ar``: the rank's [M, K] @ [K, N] with K already split;
``ag_mm``: the gathered rows), ``ratio`` the kernel's time over cuBLAS's (``fused``: with its fused
epilogue over cuBLAS plus the separate epilogue kernel), other keys informative (times, config, source),
but for ``best_config`` / ``best_variant_ratio``: the fastest config the benchmark timed, bench-only variants
included, and its ratio, and ``variants``: the next fastest bench-only variants, ``[config, ratio]`` each. Where a
variant measured faster by ``knobs.codegen.MEASURED_VARIANT_GAIN``, the ops of :data:`VARIANT_KERNELS` tune over
the fastest such one they may take (:func:`adopted_variant`) too, those of :data:`FORM_KERNELS` run its Gluon form,
and the kernel's ratio is that variant's.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
from pathlib import Path

from .knobs import codegen as _codegen
from .knobs import cta as _cta
from .knobs import symm as _symm
from .knobs.base import generation as _generation

PACKAGED = Path(__file__).with_name("kernel_ratios.json")
FORMAT = 1
_cache: dict[tuple, list[dict]] = {}


def path() -> Path:
    return Path(_symm.KERNEL_RATIOS_FILE) if _symm.KERNEL_RATIOS_FILE else PACKAGED


def entries(file: Path | None = None) -> list[dict]:
    """The entries of ``file`` (default :func:`path`), read once per (file, modification time); a
    missing or unreadable file has none (the shape rules then decide)."""
    file = Path(file) if file is not None else path()
    try:
        key = (str(file), os.stat(file).st_mtime_ns)
    except OSError:
        return []
    if key not in _cache:
        try:
            data = json.loads(file.read_text())
            rows = data["entries"] if data.get("format") == FORMAT else []
        except (OSError, ValueError, KeyError, AttributeError):
            rows = []
        _cache.clear()
        _cache[key] = [r for r in rows if _valid(r)]
    return _cache[key]


def _valid(r) -> bool:
    try:
        return (isinstance(r["gpu"], str) and isinstance(r["kernel"], str) and float(r["ratio"]) > 0
                and all(int(r[d]) > 0 for d in ("M", "K", "N", "ws")))
    except (KeyError, TypeError, ValueError):
        return False


@functools.cache
def _device_name(index: int) -> str:
    import torch

    return torch.cuda.get_device_name(index)


def gpu_name() -> str | None:
    """The current CUDA device's name (None without CUDA): one model per node, so alike on every rank."""
    import torch

    if not torch.cuda.is_available():
        return None
    return _device_name(torch.cuda.current_device())


def dtype_name(dtype) -> str:
    """``torch.bfloat16`` / ``"torch.bfloat16"`` / ``"bfloat16"`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def distance(entry: dict, M: int, K: int, N: int, ws: int) -> float:
    """log2-space distance between a measured shape and (M, K, N, ws)."""
    return math.sqrt(sum(math.log2(max(v, 1) / int(entry[d])) ** 2
                         for d, v in (("M", M), ("K", K), ("N", N), ("ws", ws))))


def nearest(kernel: str, M: int, K: int, N: int, *, ws: int = 1, dtype="bfloat16", gpu: str | None = None,
            fused: bool = False, file: Path | None = None) -> dict | None:
    """The measured entry of ``kernel`` nearest to this GEMM on this GPU and dtype, within
    ``knobs.symm.KERNEL_RATIO_MAX_DISTANCE`` (None: none that near, or no GPU)."""
    gpu = gpu if gpu is not None else gpu_name()
    if gpu is None or min(M, K, N) <= 0:
        return None
    dt = dtype_name(dtype)
    best, best_d = None, _symm.KERNEL_RATIO_MAX_DISTANCE
    for e in entries(file):
        if e["gpu"] != gpu or e["kernel"] != kernel or e.get("dtype", "bfloat16") != dt or bool(e.get("fused")) != fused:
            continue
        d = distance(e, M, K, N, ws)
        if d < best_d or (best is None and d == best_d):  # ties: the first listed
            best, best_d = e, d
    return best


# The collective GEMMs' cuBLAS paths: the kernel benchmark times them without epilogues, which they run apart.
PLAIN_MEASURED_PATHS = ("ag_mm_cublas", "mm_rs_cublas", "mm_ar_cublas")
# The kernels whose ops add the benchmark's best variant at the nearest measured shape to their tuning candidates.
VARIANT_KERNELS = ("ag_mm", "mm_rs", "mm_ar", "moe_down")
# The kernels whose ops take a measured variant only as a Gluon form of their own tiles (config[6], no split-K runs:
# config[7] == 1), while ``knobs.cta.STAGE0_FORM`` is "measured".
FORM_KERNELS = ("cta_stage0",)


def measured_ratio(kernel: str, M: int, K: int, N: int, **kw) -> float | None:
    """The nearest measured kernel/cuBLAS ratio (see :func:`nearest`), or None: the op's candidates' best, or the
    variant's where the op tunes over it too (:func:`measured_variant`)."""
    e = nearest(kernel, M, K, N, **kw)
    if e is None:
        return None
    adopted = adopted_variant(e)
    return adopted[1] if adopted else float(e["ratio"])


def measured_variant(kernel: str, M: int, K: int, N: int, **kw) -> tuple | None:
    """The config of the benchmark's fastest bench-only variant at the nearest measured shape (see :func:`nearest`),
    where it measured at least ``knobs.codegen.MEASURED_VARIANT_GAIN`` faster than the op's candidates and
    ``kernel`` is one of :data:`VARIANT_KERNELS`: the op tunes over it too. Else None. At a nearby shape where
    that config does not fit (its BM not dividing the rows a TMA store needs), the op tunes over its own
    candidates only, while :func:`measured_ratio` still reads the variant's ratio: an estimate off by that gain."""
    e = nearest(kernel, M, K, N, **kw)
    adopted = adopted_variant(e) if e is not None else None
    return adopted[0] if adopted else None


def kernel_ms(e: dict) -> float | None:
    """Entry ``e``'s kernel time (ms): its candidates' best, or that of the variant its op tunes over too (the same
    run's time scaled by the two ratios); None where not recorded."""
    ms = e.get("kernel_ms")
    adopted = adopted_variant(e)
    return ms * adopted[1] / float(e["ratio"]) if ms is not None and adopted else ms


def adopted_variant(e: dict) -> tuple[tuple, float] | None:
    """(config, ratio) of the variant the op of entry ``e`` (or of a kernel benchmark row with the same keys) tunes
    over too, or None: the fastest of ``best_config`` and the next ``variants`` that measured at least
    ``knobs.codegen.MEASURED_VARIANT_GAIN`` faster than the candidates, but none whose store field
    ``knobs.codegen.VARIANTS_NOT_ADOPTED`` names for the kernel (the next such variant then)."""
    gain = _codegen.MEASURED_VARIANT_GAIN
    if gain is None or e["kernel"] not in VARIANT_KERNELS + FORM_KERNELS:
        return None
    tried = [(e.get("best_config"), e.get("best_variant_ratio")), *(tuple(v) for v in e.get("variants") or ())]
    for config, ratio in sorted((v for v in tried if v[1] is not None), key=lambda v: float(v[1])):
        if not _may_adopt(e["kernel"], config) or float(ratio) > float(e["ratio"]) * (1 - gain):
            continue
        return tuple(config), float(ratio)
    return None


def _may_adopt(kernel: str, config) -> bool:
    """Whether ``kernel``'s op may take the bench variant ``config`` (see :func:`adopted_variant`)."""
    if not isinstance(config, list | tuple):
        return False
    if kernel in FORM_KERNELS:
        return (_cta.STAGE0_FORM == "measured" and len(config) == 8 and isinstance(config[6], str)
                and config[7] == 1)
    return len(config) == 7 and config[6] not in _codegen.VARIANTS_NOT_ADOPTED.get(kernel, ())


def kernel_loses(kernel: str, M: int, K: int, N: int, **kw) -> bool | None:
    """Whether ``kernel`` measured more than ``knobs.symm.CUBLAS_ABOVE_RATIO`` times cuBLAS near this GEMM
    (True: compute it on cuBLAS), False where it measured at most that, None where nothing was measured
    near it (or the threshold is off): the shape rules decide."""
    if _symm.CUBLAS_ABOVE_RATIO is None:
        return None

    def verdict():
        r = measured_ratio(kernel, M, K, N, **kw)
        return None if r is None else r > _symm.CUBLAS_ABOVE_RATIO

    return _memo((_generation(), kernel, M, K, N, tuple(sorted(kw.items()))), verdict)


def fuses_epilogue(kernel: str, M: int, K: int, N: int, **kw) -> bool | None:
    """Whether the op should fuse its epilogue into ``kernel``'s tiles at this GEMM (``kw``: as :func:`nearest`,
    without ``fused``): False where the kernel run plain with the epilogue apart after it (the benchmark's
    ``apart_ratio``, timed over the same baseline as the fused kernel's ``ratio``) measured at least
    ``knobs.symm.EPILOGUE_APART_GAIN`` faster; True where it did not; None where that was not measured near
    (or the knob is off): the op fuses."""
    gain = _symm.EPILOGUE_APART_GAIN
    if gain is None:
        return None

    def verdict():
        e = nearest(kernel, M, K, N, fused=True, **kw)
        if e is None or e.get("apart_ratio") is None:
            return None
        return not float(e["apart_ratio"]) <= measured_ratio(kernel, M, K, N, fused=True, **kw) * (1 - gain)

    return _memo((_generation(), "fuses", kernel, M, K, N, tuple(sorted(kw.items()))), verdict)


def measured_choice(kernel: str, M: int, K: int, N: int, *, path: str | None = None, path_required: bool = False,
                    **kw) -> str | None:
    """The op's path for this GEMM where measurements decide it, else None (the shape rules decide). ``path``
    (default ``"<kernel>_cublas"``): bench_kernels' rows of the op's cuBLAS path against one cuBLAS GEMM.

    - the kernel measured over ``knobs.symm.CUBLAS_ABOVE_RATIO`` times cuBLAS: "cublas", unless the path, where
      measured, is slower still ("triton"); with ``path_required``, "cublas" only where the path was measured;
    - the kernel within it: "triton" where the path measured slower than the kernel, else None;
    - the kernel not measured near (or the threshold off): None.

    A fused GEMM's path of :data:`PLAIN_MEASURED_PATHS` measured only without the epilogue reads that ratio: the
    path runs the epilogue apart, as the baseline does, which adds the same time to both, so the plain ratio bounds
    the fused one from above."""
    if _symm.CUBLAS_ABOVE_RATIO is None:
        return None
    path = path or kernel + "_cublas"

    def path_ratio():
        got = measured_ratio(path, M, K, N, **kw)
        if got is not None or not kw.get("fused") or path not in PLAIN_MEASURED_PATHS:
            return got
        return measured_ratio(path, M, K, N, **{**kw, "fused": False})

    return _memo((_generation(), "choice", kernel, path, path_required, M, K, N, tuple(sorted(kw.items()))),
                 lambda: _choice(measured_ratio(kernel, M, K, N, **kw), path_ratio(), path_required))


def _choice(on_kernel: float | None, on_path: float | None, path_required: bool = False) -> str | None:
    if on_kernel is None:
        return None
    if on_kernel > _symm.CUBLAS_ABOVE_RATIO:
        if on_path is None:
            return "triton" if path_required else "cublas"
        return "cublas" if on_path < on_kernel else "triton"
    return "triton" if on_path is not None and on_path > on_kernel else None


def _memo(key: tuple, compute):
    """``compute()`` once per key: a scan of the file's entries once per shape and knob generation (ops decide per
    call; a file rewritten while the process runs counts after forget())."""
    value = _verdicts.get(key, _UNSEEN)
    if value is _UNSEEN:
        value = compute()
        if len(_verdicts) >= 4096:
            _verdicts.clear()
        _verdicts[key] = value
    return value


_verdicts: dict[tuple, bool | str | None] = {}
_UNSEEN = object()


def forget() -> None:
    """Read the ratio file again at the next lookup (it was rewritten while the process runs)."""
    _verdicts.clear()
    _cache.clear()


@contextlib.contextmanager
def reading(file):
    """Within: lookups read ``file`` (``knobs.symm.KERNEL_RATIOS_FILE``) instead, nothing cached from either file
    leaking across the switch (a benchmark's ratios, asking the runtime's choices what they decide on them)."""
    with _symm.patch(KERNEL_RATIOS_FILE=str(file)):
        forget()
        try:
            yield
        finally:
            forget()


def document(rows: list[dict], about: str = "") -> dict:
    """A kernel-ratio file's contents (what ``bench_kernels.py`` writes)."""
    return {"format": FORMAT, "about": about, "entries": rows}
