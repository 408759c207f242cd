"""Block configurations of the tile kernels, autotuned once per shape and cached (memory + disk).

A config is ``(BM, BN, BK, GROUP_M, num_stages, num_warps, store)``; ``store`` is False (pointer
stores), True (an asynchronous TMA epilogue store) or a variant name of ``STORE_VARIANTS`` (TMA stores
with the epilogue in two column halves, a warp-specialized or flattened tile loop, ``ag_mm``'s warp-specialized
Gluon kernel), the TMA ones only where the
kernel can use them (``tma_store_rows``). The variants are measured by ``bench/suites/bench_kernels.py``
and tuned over only with ``knobs.codegen.TUNE_VARIANTS``. The candidates
are tunables (``knobs.codegen.CANDIDATES_16BIT`` / ``CANDIDATES_32BIT``); the first is the one
measured at ~cuBLAS speed on H200 (BM=128 BN=256 BK=64, 3 stages, 8 warps). Tuning
times each candidate on the real problem with every flag already raised (epoch 0), so the numbers
are the GEMM's own; the winner only changes this rank's kernel, never what is communicated, so
ranks may pick differently. Disk cache: ``cache_path("autotune")/tiles.json`` (under
``OVERLAP_CACHE_DIR``, see :mod:`overlap_backend.spec.cache`), keyed by GPU name, Triton version,
the knobs' hash, kernel and shape.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from ..spec import knobs
from ..spec.cache import cache_path

log = logging.getLogger("overlap_backend.codegen")

Config = tuple[int, int, int, int, int, int, bool]

_lock = threading.Lock()
_memory: dict[str, Config] = {}  # the contents of _loaded_from, and what was tuned since
_loaded_from: Path | None = None


# store field -> (TMA store, epilogue in two column halves, warp-specialized tile loop, flattened tile loop);
# "ws_pingpong" / "ws_coop": the Gluon kernels of codegen/ag_mm_ws.py and codegen/mm_rs_ws.py (a TMA loader warp; two
# MMA warpgroups taking tiles in turns, or sharing each tile: ag_mm only); "ws_pingpong_direct": mm_rs's, its staged
# tiles stored by its threads instead of TMA
STORE_VARIANTS = {False: (False, False, False, False), True: (True, False, False, False),
                  "tma_subtile": (True, True, False, False), "tma_ws": (True, False, True, False),
                  "tma_flatten": (True, False, False, True), "tma_subtile_flatten": (True, True, False, True),
                  "ws_pingpong": (True, False, True, False), "ws_coop": (True, False, True, False),
                  "ws_pingpong_direct": (True, False, True, False)}
GLUON_STORES = ("ws_pingpong", "ws_coop", "ws_pingpong_direct")


def store_variant(store) -> tuple[bool, bool, bool, bool]:
    """(TMA store, subtiled epilogue, warp specialization, flattened tile loop) of a config's store field."""
    try:
        return STORE_VARIANTS[store]
    except (KeyError, TypeError):
        raise ValueError(f"store variant {store!r} is not one of {list(STORE_VARIANTS)}") from None


def candidates(dtype: torch.dtype, row_multiple: int | None = None, tma_store_rows: int | None = None,
               variants: bool | None = None, kernel: str = "ag_mm", measured: Config | None = None) -> list[Config]:
    """Candidates for ``dtype``; with ``row_multiple``, only those whose BM divides it (tiles that
    must not straddle two runs of rows); with ``tma_store_rows``, also TMA-store variants of the
    first candidates whose BM divides it (tiles that must not straddle two chunks). ``variants``
    (default ``knobs.codegen.TUNE_VARIANTS``): also ``variant_candidates`` of ``kernel``. ``measured``
    (``spec.kernel_ratios.measured_variant``): one more config, where it fits the problem as those do."""
    cands = list(knobs.codegen.CANDIDATES_32BIT if dtype == torch.float32 else knobs.codegen.CANDIDATES_16BIT)
    if row_multiple is not None:
        cands = [c for c in cands if row_multiple % c[0] == 0]
    if tma_store_rows:
        cands += [(*c[:6], True) for c in cands[:knobs.codegen.TMA_STORE_VARIANTS] if tma_store_rows % c[0] == 0]
    if knobs.codegen.TUNE_VARIANTS if variants is None else variants:
        cands += [c for c in variant_candidates(dtype, kernel, row_multiple, tma_store_rows) if c not in cands]
    if measured is not None and dtype != torch.float32 and tuple(measured) not in cands and fits(
            tuple(measured), row_multiple, tma_store_rows):
        cands.append(tuple(measured))
    return cands


# ``tma_store_rows`` of a kernel whose TMA stores take any rows (the MoE down GEMM's: full consecutive tiles by TMA)
ANY_ROWS = -1


def fits(c: Config, row_multiple: int | None, tma_store_rows: int | None) -> bool:
    """BM divides ``row_multiple``; a TMA-store config only with ``tma_store_rows`` that BM divides (or ``ANY_ROWS``)."""
    if row_multiple is not None and row_multiple % c[0]:
        return False
    if tma_store_rows == ANY_ROWS:
        return True
    return not store_variant(c[6])[0] or bool(tma_store_rows and tma_store_rows % c[0] == 0)


def variant_candidates(dtype: torch.dtype, kernel: str, row_multiple: int | None = None,
                       tma_store_rows: int | None = None) -> list[Config]:
    """``knobs.codegen.VARIANTS_16BIT[kernel]`` (16-bit dtypes only) that fit: BM dividing
    ``row_multiple``, TMA variants only with ``tma_store_rows`` that BM divides (any with ``ANY_ROWS``)."""
    if dtype == torch.float32:
        return []
    return [tuple(c) for c in knobs.codegen.VARIANTS_16BIT.get(kernel, ()) if fits(tuple(c), row_multiple, tma_store_rows)]


def cache_file() -> Path:
    """The autotune cache: one JSON object, tuning key -> config."""
    return cache_path("autotune") / "tiles.json"


def _device_key() -> str:
    import triton

    return f"{torch.cuda.get_device_name()}|triton {triton.__version__}"


def tuning_key(kernel: str, shape_key: tuple) -> str:
    """The cache key of one tuning: the GPU, Triton, every knob (a patched candidate table or any other
    knob never reuses a winner picked under other values), the kernel and its shape."""
    return f"{_device_key()}|knobs {knobs.knobs_hash()}|{kernel}|{shape_key}"


def _load_disk() -> None:
    global _loaded_from
    path = cache_file()
    if _loaded_from == path:
        return
    _loaded_from = path
    _memory.clear()  # another cache root (OVERLAP_CACHE_DIR changed): its file is the cache now
    try:
        data = json.loads(path.read_text())
        _memory.update({k: tuple(v) for k, v in data.items()})
    except (OSError, ValueError):
        pass


def _save_disk() -> None:
    path = cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(_memory, indent=0, sort_keys=True))
        os.replace(tmp, path)
    except OSError as e:  # a read-only home is no reason to fail
        log.debug("overlap: cannot write the tile-config cache %s: %s", path, e)


def pick(kernel: str, shape_key: tuple, cands: list[Config], time_ms: Callable[[Config], float]) -> Config:
    """The fastest of ``cands`` for this kernel and shape (``time_ms(config)`` measures one), timed in
    ``knobs.codegen.TUNE_ROUNDS`` rounds."""
    if not cands:
        raise ValueError(f"no block configuration fits {kernel} {shape_key}")
    if len(cands) == 1 or not knobs.codegen.AUTOTUNE:
        return cands[0]
    key = tuning_key(kernel, shape_key)
    with _lock:
        _load_disk()
        if key in _memory and tuple(_memory[key]) in cands:
            return tuple(_memory[key])
    samples, errors = {cfg: [] for cfg in cands}, {}
    for r in range(max(1, knobs.codegen.TUNE_ROUNDS)):
        for cfg in cands if r % 2 == 0 else cands[::-1]:  # (a drifting clock falls alike on every candidate)
            if cfg in errors:
                continue
            try:
                samples[cfg].append(time_ms(cfg))
            except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: not a candidate here
                errors[cfg] = f"{type(e).__name__}: {e}"
                log.info("overlap: config %s of %s failed: %s", cfg, kernel, errors[cfg])
    timings = {cfg: sum(t) / len(t) for cfg, t in samples.items() if cfg not in errors}
    if not timings:
        detail = "; ".join(f"{c}: {e[:400]}" for c, e in errors.items())
        raise RuntimeError(f"every block configuration of {kernel} failed for {shape_key}: {detail}")
    best = min(timings, key=timings.get)
    log.info("overlap: %s %s -> %s (%s)", kernel, shape_key, best,
             ", ".join(f"{c}: {t:.3f} ms" for c, t in timings.items()))
    with _lock:
        _memory[key] = best
        _save_disk()
    return best
