"""Per-machine calibration of the cost model (``cost/model.py``): the numbers, their defaults, their cache.

What the cost model needs from a machine, as numbers (:class:`Calibration`): the GEMM rate per
dtype and the memory bandwidth of a weight-bound GEMM, the bus bandwidth and latency of NCCL
collectives per group size, the bandwidth of a ``batch_isend_irecv`` ring shift (the ``p2p``
lowering's transfers) and of a copy-engine peer copy (the ``symm`` lowering's), the SM count, and the
host time per call of our ops (fitted constants, see ``docs/cost_model.md``; measured where the symm
lowering runs with ``--host``).

They are measured once per machine and software stack by ``overlap_backend/tools/calibrate.py``::

    torchrun --nproc-per-node=<GPUs> -m overlap_backend.tools.calibrate    # writes the cache file
    python -m overlap_backend.tools.calibrate --show                        # what the passes would use

The file is ``<cache>/calibration/<key>.json``, ``<cache>`` the backend's one cache root
(``overlap_backend.spec.cache``: ``OVERLAP_CACHE_DIR``, else ``$XDG_CACHE_HOME/overlap_backend``, else
``~/.cache/overlap_backend``), ``<key>`` naming the GPU model, the GPU count and the torch / Triton /
NCCL versions (:func:`calibration_key`): a new driver stack or another machine type gets its own file.
Without a file the built-in defaults of the device class apply (:data:`DEFAULTS`: H200 numbers measured
on the bench machines, H100 derived from them, a generic CUDA fallback, and a CPU/gloo one). Nothing is
ever measured while compiling.

A corrupt or mismatched file is ignored with a warning (the defaults apply). Ranks agree on the
calibration before the passes use it (``cost/decision.py``, ``calibration_for``): see there why.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..spec.cache import cache_path

log = logging.getLogger("overlap_backend")

FORMAT = 1  # bump when the fields' meaning changes: older files are then ignored


@dataclass(frozen=True)
class Calibration:
    """Machine numbers of the cost model. Bandwidths in GB/s (1e9 bytes/s), times in ms."""

    device_class: str  # "h200" | "h100" | "cuda" | "cpu"
    gemm_tflops: dict[str, float]  # achieved by a large matmul, per dtype name ("bfloat16", ...)
    hbm_gbps: float  # effective memory bandwidth of a weight-bound (small-M) matmul
    launch_ms: float  # fixed time per GEMM kernel (launch, tail wave)
    coll_busbw_gbps: dict[int, float]  # NCCL all-gather bus bandwidth, by group size
    coll_latency_ms: float  # NCCL collective latency (small messages)
    p2p_gbps: dict[int, float]  # batch_isend_irecv ring shift, bytes received per rank, by group size
    p2p_latency_ms: float
    ce_gbps: float  # copy-engine peer copy (cuMemcpyAsync into a peer's buffer), bytes received per rank
    num_sms: int
    # Host time of our ops (Python, launches, stream operations), fitted on bench/results (docs/cost_model.md)
    p2p_call_ms: float  # fixed part of a p2p op call
    p2p_step_ms: float  # per ring step of a p2p op (batch_isend_irecv on a side stream, events, waits)
    symm_call_ms: dict[str, float]  # per symm op: host time of one call (the op is host-bound below it)
    key: str = ""
    source: str = "default"  # "default:<class>" | "file:<path>" | "agreed:rank0 (<source>)"
    measured: tuple[str, ...] = ()  # fields measured on this machine (the rest: defaults of the class)
    info: dict[str, Any] = field(default_factory=dict)  # machine, versions, date, command

    def rate(self, dtype: str) -> float:
        """TFLOP/s for ``dtype`` (float64 and unknown dtypes: the float32 rate)."""
        return self.gemm_tflops.get(dtype) or self.gemm_tflops.get("float32") or min(self.gemm_tflops.values())

    def busbw(self, ws: int) -> float:
        return _by_size(self.coll_busbw_gbps, ws)

    def p2p_bw(self, ws: int) -> float:
        return _by_size(self.p2p_gbps, ws)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["coll_busbw_gbps"] = {str(k): v for k, v in self.coll_busbw_gbps.items()}
        d["p2p_gbps"] = {str(k): v for k, v in self.p2p_gbps.items()}
        d["measured"] = list(self.measured)
        d["format"] = FORMAT
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Calibration:
        if d.get("format") != FORMAT:
            raise ValueError(f"format {d.get('format')!r}, expected {FORMAT}")
        names = {f.name for f in dataclasses.fields(cls)}
        missing = names - set(d) - {"key", "source", "measured", "info"}
        if missing:
            raise ValueError(f"missing fields {sorted(missing)}")
        kw = {k: v for k, v in d.items() if k in names}
        kw["coll_busbw_gbps"] = {int(k): float(v) for k, v in d["coll_busbw_gbps"].items()}
        kw["p2p_gbps"] = {int(k): float(v) for k, v in d["p2p_gbps"].items()}
        kw["gemm_tflops"] = {str(k): float(v) for k, v in d["gemm_tflops"].items()}
        kw["symm_call_ms"] = {str(k): float(v) for k, v in d["symm_call_ms"].items()}
        kw["measured"] = tuple(d.get("measured", ()))
        cal = cls(**kw)
        for name in ("hbm_gbps", "ce_gbps", "launch_ms", "coll_latency_ms", "p2p_latency_ms"):
            if not float(getattr(cal, name)) >= 0:
                raise ValueError(f"{name}={getattr(cal, name)!r}")
        if not cal.gemm_tflops or not cal.coll_busbw_gbps or not cal.p2p_gbps or cal.num_sms < 1:
            raise ValueError("empty rate tables or no SMs")
        if min([*cal.gemm_tflops.values(), *cal.coll_busbw_gbps.values(), *cal.p2p_gbps.values(), cal.hbm_gbps,
                cal.ce_gbps]) <= 0:
            raise ValueError("a rate or bandwidth is not positive")
        return cal


def _by_size(table: dict[int, float], ws: int) -> float:
    """The entry for group size ``ws``: exact, else linear in ws between neighbours, else the nearest."""
    if ws in table:
        return table[ws]
    sizes = sorted(table)
    lower = [s for s in sizes if s < ws]
    upper = [s for s in sizes if s > ws]
    if lower and upper:
        a, b = lower[-1], upper[0]
        return table[a] + (table[b] - table[a]) * (ws - a) / (b - a)
    return table[lower[-1]] if lower else table[upper[0]]


# Host times per symm call. ag_mm, mm_rs, mm_ar one-shot: host µs per call of the compiled graph at M = 512,
# K = N = 4096 bf16 (bench/results/host_h200x1_2026-12-02/whole_chunk, bench_host.py: 40 unwaited calls, ranks
# sharing one H200): 257, 334 and 288 µs. mm_ar's rounds: fitted on
# bench/results/collective_gemm_h200x2_2026-11-29/band_flags (back-to-back times of decode shapes); with ranks
# sharing a GPU its bursts measure the GPU's time-slicing, not the host. The same Python code on another host
# CPU runs at another speed, so they belong to the machine.
# moe_experts: bench/results/host_h200x2_2026-11-30/per_call (decode sizes with the plan kernel, ~0.5-0.6 ms
# of device work: 0.85-1.72 ms per call, median 1.23; 2.3-2.9 ms before the plan kernel,
# bench/results/moe_h200x2_2026-11-30/grouped_raster)
# cta_pipeline_mlp: eager GELU M=512, host-bound, 0.45-0.46 ms per call in bench/results/cta_h200x2_2026-11-30/last_group_tails
# and 0.58-0.66 in bench/results/cta_h200x2_2026-11-30/tma_store (other hosts; 0.42 ms of GPU time): between them
_H200_SYMM_CALL_MS = {"ag_mm": 0.26, "mm_rs": 0.33, "mm_ar_oneshot": 0.29, "mm_ar": 0.50,
                      "cta_pipeline_mlp": 0.52, "moe_experts": 1.2}

# Built-in calibrations per device class. H200: measured on the 2x/4xH200 bench machines
# (bench/results/*_h200x2_2026-11-29, *_h200x4_2026-11-30; docs/architecture.md "Measured on 4xH200"), see
# docs/cost_model.md for which number comes from which table.
DEFAULTS: dict[str, Calibration] = {
    "h200": Calibration(
        device_class="h200",
        # bf16/fp16: cuBLAS at 4096..16384 x 8192 x 7168/14336 on the bench machines (690-700 TFLOP/s);
        # fp32 without TF32 (torch's default): the H200's FP32 rate; float64 runs on FP64 tensor cores.
        gemm_tflops={"bfloat16": 690.0, "float16": 690.0, "float32": 55.0, "float64": 55.0},
        hbm_gbps=3700.0,  # decode GEMMs: 117 MB of weights in 0.034-0.044 ms; TP2 MLP at M=128
        launch_ms=0.005,
        coll_busbw_gbps={2: 240.0, 4: 300.0, 8: 330.0},  # NCCL all-gather columns (8: not measured)
        coll_latency_ms=0.03,
        p2p_gbps={2: 170.0, 4: 110.0, 8: 80.0},  # fitted: ours p2p at 16384 x 8192 x 2048 (8: not measured)
        p2p_latency_ms=0.02,
        ce_gbps=300.0,  # probe_symm: copy-engine push 282-307 GB/s received at >= 134 MB
        num_sms=132,
        p2p_call_ms=0.10,
        p2p_step_ms=0.40,
        symm_call_ms=dict(_H200_SYMM_CALL_MS),
        key="default-h200",
        source="default:h200",
    ),
}
# H100 SXM: the H200's compute and NVLink, HBM3 at 3.35 instead of 4.8 TB/s peak (derived, not measured).
DEFAULTS["h100"] = dataclasses.replace(
    DEFAULTS["h200"], device_class="h100", hbm_gbps=3700.0 * 3.35 / 4.8, key="default-h100", source="default:h100"
)
# Any other CUDA GPU: conservative (a rewrite has to win clearly to be predicted a win).
DEFAULTS["cuda"] = dataclasses.replace(
    DEFAULTS["h200"], device_class="cuda", gemm_tflops={"bfloat16": 300.0, "float16": 300.0, "float32": 20.0,
                                                        "float64": 10.0},
    hbm_gbps=1500.0, coll_busbw_gbps={2: 100.0, 4: 100.0, 8: 100.0}, p2p_gbps={2: 50.0, 4: 40.0, 8: 30.0},
    ce_gbps=100.0, num_sms=80, key="default-cuda", source="default:cuda",
)
# CPU processes over gloo (the test path): two-core machines, loopback TCP. Rough, never measured by
# calibrate (there is nothing to calibrate for production there); what matters is that tiny matches
# cost more as ring steps than they can hide and that large ones are not hopeless.
DEFAULTS["cpu"] = Calibration(
    device_class="cpu",
    gemm_tflops={"bfloat16": 0.02, "float16": 0.02, "float32": 0.05, "float64": 0.025},
    hbm_gbps=10.0,
    launch_ms=0.01,
    coll_busbw_gbps={2: 2.0, 4: 1.5, 8: 1.0},
    coll_latency_ms=0.1,
    p2p_gbps={2: 2.0, 4: 1.5, 8: 1.0},
    p2p_latency_ms=0.05,
    ce_gbps=2.0,
    num_sms=1,
    p2p_call_ms=0.05,
    p2p_step_ms=0.1,
    symm_call_ms={op: 1.0 for op in _H200_SYMM_CALL_MS},
    key="default-cpu",
    source="default:cpu",
)


def device_class(gpu_name: str | None) -> str:
    """The built-in defaults that fit ``gpu_name`` (``torch.cuda.get_device_name``); None: CPU."""
    if gpu_name is None:
        return "cpu"
    name = gpu_name.upper()
    if "H200" in name:
        return "h200"
    if "H100" in name or "H800" in name or "GH200" in name:
        return "h100"
    return "cuda"


# ------------------------------------------------------------------------------------------ keys
def local_versions() -> dict[str, str]:
    """The torch / Triton / NCCL versions of this process (``"none"`` where one is absent)."""
    out = {"torch": torch.__version__.split("+")[0]}
    try:
        import triton

        out["triton"] = triton.__version__
    except Exception:  # noqa: BLE001 - no Triton: its own key component
        out["triton"] = "none"
    try:
        v = torch.cuda.nccl.version() if torch.cuda.is_available() else None
        out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else (str(v) if v else "none")
    except Exception:  # noqa: BLE001
        out["nccl"] = "none"
    return out


def calibration_key(gpu_name: str, gpu_count: int, versions: dict[str, str] | None = None) -> str:
    """``<gpu model>_x<count>_torch<v>_triton<v>_nccl<v>``, filesystem-safe.

    The knobs (``spec.knobs.knobs_hash``) are not part of the key: a calibration holds the machine's
    rates, measured with plain torch GEMMs and NCCL calls that no knob changes, and the model applies
    the knobs itself at each prediction; keyed by them, every patched knob (a bench's ``--set``) would
    drop the machine's file and price the device class's defaults instead."""
    v = versions or local_versions()
    model = re.sub(r"[^A-Za-z0-9.]+", "-", gpu_name).strip("-").lower() or "gpu"
    raw = f"{model}_x{gpu_count}_torch{v.get('torch', 'none')}_triton{v.get('triton', 'none')}_nccl{v.get('nccl', 'none')}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", raw)


def local_key() -> tuple[str | None, str]:
    """(GPU name or None, key) of this process's machine: the current CUDA device's model and the
    number of GPUs visible on the node."""
    if not torch.cuda.is_available():
        return None, "cpu"
    name = torch.cuda.get_device_name(torch.cuda.current_device())
    return name, calibration_key(name, torch.cuda.device_count())


def cache_file(key: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """The file of calibration ``key`` under the cache root (``cache_dir``, else ``OVERLAP_CACHE_DIR``, ...)."""
    return cache_path("calibration", cache_dir) / f"{key}.json"


def save(cal: Calibration, cache_dir: str | os.PathLike | None = None) -> Path:
    path = cache_file(cal.key, cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(cal.to_json(), indent=2, sort_keys=True))
    os.replace(tmp, path)
    return path


def load(key: str, cache_dir: str | os.PathLike | None = None) -> Calibration | None:
    """The cached calibration for ``key``; None when there is none, or (with a warning) when the file
    cannot be read, is not valid, or holds another key."""
    path = cache_file(key, cache_dir)
    if not path.is_file():
        return None
    try:
        d = json.loads(path.read_text())
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        if d.get("key") != key:
            raise ValueError(f"it holds key {d.get('key')!r}")
        cal = Calibration.from_json(d)
    except Exception as e:  # noqa: BLE001 - any problem: ignore the file, say why
        log.warning("overlap cost model: ignoring calibration file %s (%s: %s); using the built-in defaults",
                    path, type(e).__name__, e)
        return None
    return dataclasses.replace(cal, source=f"file:{path}")


def load_or_default(cache_dir: str | os.PathLike | None = None) -> Calibration:
    """This machine's calibration: the cached file for its key, else its device class's defaults."""
    name, key = local_key()
    if name is None:
        return DEFAULTS["cpu"]
    return load(key, cache_dir) or dataclasses.replace(DEFAULTS[device_class(name)], key=key,
                                                        source=f"default:{device_class(name)}")


__all__ = ["DEFAULTS", "FORMAT", "Calibration", "cache_file", "calibration_key", "device_class", "load",
           "load_or_default", "local_key", "local_versions", "save"]
