"""Per-machine calibration of the cost model (``passes/cost_model.py``): measured once, cached on disk.

What the cost model needs from a machine, as numbers (:class:`Calibration`): the GEMM rate per
dtype and the memory bandwidth of a weight-bound GEMM, the bus bandwidth and latency of NCCL
collectives per group size, the bandwidth of a ``batch_isend_irecv`` ring shift (the ``p2p``
lowering's transfers) and of a copy-engine peer copy (the ``symm`` lowering's), the SM count, and the
host time per call of our ops (fitted constants, see ``docs/cost_model.md``; with ``--host`` the ``symm``
ones of ``ag_mm``, ``mm_rs`` and ``mm_ar`` are measured where that lowering runs here, :func:`measure_host`).

Measure on GPUs, once per machine and software stack::

    torchrun --nproc-per-node=<GPUs> -m overlap_backend.calibrate        # writes the cache file
    python -m overlap_backend.calibrate --show                            # what the passes would use

The file is ``<cache>/calibration/<key>.json`` with ``<cache>`` = ``OVERLAP_CACHE_DIR``, else
``$XDG_CACHE_HOME/overlap_backend``, else ``~/.cache/overlap_backend``, and ``<key>`` naming the GPU
model, the GPU count and the torch / Triton / NCCL versions (:func:`calibration_key`): a new driver
stack or another machine type gets its own file. Without a file the built-in defaults of the device
class apply (:data:`DEFAULTS`: H200 numbers measured on the bench machines, H100 derived from them,
a generic CUDA fallback, and a CPU/gloo one). Nothing is ever measured while compiling.

A corrupt or mismatched file is ignored with a warning (the defaults apply). Ranks agree on the
calibration before the passes use it (``cost_model.calibration_for``): see there why.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

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


# Host times per symm call, fitted on bench/results/2026-11-29_h200x2_symm_bands and
# 2026-11-30_h200x2_cta ("back-to-back" times of decode shapes, where the device work is ~0.1 ms):
# the same Python code on another host CPU runs at another speed, so they belong to the machine.
# moe_experts: bench/results/2026-11-30_h200x2_session6 (decode sizes with the plan kernel, ~0.5-0.6 ms
# of device work: 0.85-1.72 ms per call, median 1.23; 2.3-2.9 ms before the plan kernel, session 5)
# cta_pipeline_mlp: eager GELU M=512, host-bound, 0.45-0.46 ms per call in the twelfth session and
# 0.58-0.66 in the thirteenth (other hosts; 0.42 ms of GPU time): between them
_H200_SYMM_CALL_MS = {"ag_mm": 0.45, "mm_rs": 0.50, "mm_ar_oneshot": 0.23, "mm_ar": 0.50,
                      "cta_pipeline_mlp": 0.52, "moe_experts": 1.2}

# Built-in calibrations per device class. H200: measured on the 2x/4xH200 bench machines
# (bench/results/2026-11-29_*, 2026-11-30_*; DESIGN.md "Measured on 4xH200"), see
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
def _versions() -> dict[str, str]:
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
    """``<gpu model>_x<count>_torch<v>_triton<v>_nccl<v>``, filesystem-safe."""
    v = versions or _versions()
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


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir`` (``OVERLAP_CACHE_DIR``), else ``$XDG_CACHE_HOME/overlap_backend``, else ``~/.cache/overlap_backend``."""
    if cache_dir:
        return Path(cache_dir)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "overlap_backend"


def cache_path(key: str, cache_dir: str | os.PathLike | None = None) -> Path:
    return cache_root(cache_dir) / "calibration" / f"{key}.json"


def save(cal: Calibration, cache_dir: str | os.PathLike | None = None) -> Path:
    path = cache_path(cal.key, cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(cal.to_json(), indent=2, sort_keys=True))
    os.replace(tmp, path)
    return path


def load(key: str, cache_dir: str | os.PathLike | None = None) -> Calibration | None:
    """The cached calibration for ``key``; None when there is none, or (with a warning) when the file
    cannot be read, is not valid, or holds another key."""
    path = cache_path(key, cache_dir)
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


# ------------------------------------------------------------------------------------ measuring
def timed_ms(fn, reps: int) -> float:
    """Median ms of ``fn`` over ``reps`` calls (CUDA events), after 3 warm-up calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def measure_gemm(device, reps: int = 20) -> tuple[dict[str, float], float]:
    """(TFLOP/s per dtype at large shapes: the best of a few, memory bandwidth of a weight-bound mm)."""
    rates = {}
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        best = 0.0
        shapes = [(8192, 8192, 7168), (4096, 8192, 7168), (16384, 2048, 8192)]
        if dtype == torch.float32:
            shapes = [(4096, 4096, 4096)]
        for m, k, n in shapes:
            a = torch.randn(m, k, device=device, dtype=dtype)
            b = torch.randn(k, n, device=device, dtype=dtype)
            ms = timed_ms(lambda: torch.mm(a, b), reps)
            best = max(best, 2 * m * n * k / (ms * 1e9))
            del a, b
        rates[str(dtype).removeprefix("torch.")] = round(best, 1)
    # weight-bound: 128 rows against 7168 x 8192 bf16 weights
    a = torch.randn(128, 7168, device=device, dtype=torch.bfloat16)
    b = torch.randn(7168, 8192, device=device, dtype=torch.bfloat16)
    ms = timed_ms(lambda: torch.mm(a, b), reps * 5)
    hbm = (a.numel() + b.numel() + 128 * 8192) * 2 / (ms * 1e6)
    rates["float64"] = rates["float32"]
    return rates, round(hbm, 1)


def measure_links(group, device, reps: int = 20) -> dict[str, Any]:
    """NCCL all-gather bus bandwidth and latency, ring-shift (batch_isend_irecv) bandwidth, and the
    copy-engine bandwidth of a peer copy, on ``group`` (collective: every rank of it calls this)."""
    import torch.distributed as dist

    ws, rank = group.size(), group.rank()
    out: dict[str, Any] = {}
    big = 64 << 20  # bytes per rank
    shard = torch.empty(big // 2, device=device, dtype=torch.bfloat16)
    full = torch.empty(ws * shard.numel(), device=device, dtype=torch.bfloat16)
    ms = timed_ms(lambda: dist.all_gather_into_tensor(full, shard, group=group), reps)
    out["busbw"] = round(big * (ws - 1) / (ms * 1e6), 1)
    tiny_s = torch.empty(1024, device=device, dtype=torch.bfloat16)
    tiny_f = torch.empty(ws * 1024, device=device, dtype=torch.bfloat16)
    out["latency_ms"] = round(timed_ms(lambda: dist.all_gather_into_tensor(tiny_f, tiny_s, group=group), reps), 4)
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    recv = torch.empty_like(shard)
    granks = dist.get_process_group_ranks(group)

    def shift():
        ops = [dist.P2POp(dist.isend, shard, granks[nxt], group), dist.P2POp(dist.irecv, recv, granks[prv], group)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()

    ms = timed_ms(shift, reps)
    out["p2p_gbps"] = round(big / (ms * 1e6), 1)
    out["p2p_latency_ms"] = round(max(0.0, ms - big / (out["p2p_gbps"] * 1e6)), 4)
    out["ce_gbps"] = _measure_ce(group, device, reps)
    return out


# The symm_call_ms entries calibrate measures, each at a decode size where a call is host-bound on H200s (the
# GPU keeps up with the host, so what back-to-back calls cost is the host's enqueue time): key -> (op, rows M,
# K, N) of the TP problem, K and N before the split over the group (as bench_collective_gemm's shapes). The
# other entries (cta_pipeline_mlp, moe_experts) keep their class defaults.
HOST_PROBES = {
    "ag_mm": ("ag_mm", 512, 8192, 7168),
    "mm_rs": ("mm_rs", 512, 7168, 8192),
    "mm_ar_oneshot": ("mm_ar", 128, 7168, 8192),  # a partial under knobs.symm.ONESHOT_MAX_BYTES
    "mm_ar": ("mm_ar", 2048, 7168, 8192),  # above it: rounds
}


def _host_probe(op: str, m: int, k: int, n: int, group, lowering: str, device, dtype):
    """One call of ``op`` on a TP problem of that size on ``group`` (fresh random inputs, made once)."""
    ws, gn = group.size(), group.group_name
    gen = torch.Generator(device="cpu").manual_seed(group.rank())
    rand = lambda *shape: torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)  # noqa: E731
    if op == "ag_mm":
        shard, w = rand(m // ws, k), rand(k, n // ws)
        return lambda: torch.ops.overlap.ag_mm(shard, [w], [None], 0, gn, lowering, False)
    a, b = rand(m, k // ws), rand(k // ws, n)
    if op == "mm_rs":
        return lambda: torch.ops.overlap.mm_rs(a, b, None, [m, n], 0, "sum", gn, lowering)
    return lambda: torch.ops.overlap.mm_ar(a, b, None, "sum", gn, lowering)


def measure_host(group, device, lowering: str = "symm", calls: int = 30, rounds: int = 3,
                 probes: dict | None = None) -> dict[str, float]:
    """Host ms per call of our ops (``symm_call_ms``): ``calls`` back-to-back calls that nothing waits
    for, timed with the host's clock after warm-up (buffers, kernels, tuning), the median of ``rounds``,
    the largest over the ranks (the slowest host paces the group). Collective: every rank of ``group``."""
    import torch.distributed as dist

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    mine = {}
    for key, (op, m, k, n) in (probes or HOST_PROBES).items():
        call = _host_probe(op, m, k, n, group, lowering, device, dtype)
        for _ in range(3):
            call()
        per_round = []
        for _ in range(rounds):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dist.barrier(group)
            start = time.perf_counter()
            for _ in range(calls):
                call()
            per_round.append((time.perf_counter() - start) * 1e3 / calls)
        mine[key] = round(sorted(per_round)[len(per_round) // 2], 4)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    everyone = [None] * group.size()
    dist.all_gather_object(everyone, mine, group=group)
    return {key: max(r[key] for r in everyone) for key in mine}


def _measure_ce(group, device, reps: int) -> float | None:
    """Copy-engine peer copy bandwidth: rank 0 of the pair pulls 256 MiB from the other GPU with
    ``copy_`` (both GPUs in this process: only where one process sees two GPUs; else None)."""
    if torch.cuda.device_count() < 2 or group.rank() != 0:
        return None
    src_dev = (device.index + 1) % torch.cuda.device_count()
    if not torch.cuda.can_device_access_peer(device.index, src_dev):
        return None
    src = torch.empty(128 << 20, dtype=torch.bfloat16, device=f"cuda:{src_dev}")
    dst = torch.empty_like(src, device=device)
    ms = timed_ms(lambda: dst.copy_(src, non_blocking=True), reps)
    return round(src.numel() * 2 / (ms * 1e6), 1)


def measure(reps: int = 20, host: bool = False) -> Calibration:
    """Measure this machine (call on every rank of the default group: collectives). Group sizes 2, 4,
    ... up to the world size, each on the first ranks (``new_group``). ``host``: also the symm ops' host
    time per call (:func:`measure_host`; opt-in, ``--host``: it has run only with two ranks sharing one
    H200, where the host times are the shared CPU's and GPU's, not a deployment's)."""
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device())
    name, key = local_key()
    base = DEFAULTS[device_class(name)]
    rates, hbm = measure_gemm(device, reps)
    world = dist.get_world_size()
    busbw, p2p, lat, p2p_lat, ce = {}, {}, [], [], []
    ws = 2
    while ws <= world:
        group = dist.new_group(list(range(ws)))
        if dist.get_rank() < ws:
            r = measure_links(group, device, reps)
            busbw[ws], p2p[ws] = r["busbw"], r["p2p_gbps"]
            lat.append(r["latency_ms"])
            p2p_lat.append(r["p2p_latency_ms"])
            if r["ce_gbps"]:
                ce.append(r["ce_gbps"])
        ws *= 2
    # every rank writes the same numbers: rank 0's (its groups took part in every size)
    mine = (rates, hbm, busbw, p2p, lat, p2p_lat, ce)
    objs = [None] * world
    dist.all_gather_object(objs, mine)
    rates, hbm, busbw, p2p, lat, p2p_lat, ce = objs[0]
    ce_all = [c for o in objs for c in o[6]]
    host_ms = {}
    if host and world >= 2:  # the symm ops' host time per call, where symm runs on this machine (an agreed answer)
        from .runtime import symm

        if symm.group_support(dist.group.WORLD.group_name) is None:
            host_ms = measure_host(dist.group.WORLD, device)
    measured = ["gemm_tflops", "hbm_gbps"] + (["coll_busbw_gbps", "coll_latency_ms", "p2p_gbps", "p2p_latency_ms"]
                                              if busbw else []) + (["ce_gbps"] if ce_all else []) + (
                                                  ["symm_call_ms"] if host_ms else [])
    return dataclasses.replace(
        base,
        gemm_tflops=rates, hbm_gbps=hbm,
        coll_busbw_gbps=busbw or base.coll_busbw_gbps,
        coll_latency_ms=_median(lat) if lat else base.coll_latency_ms,
        p2p_gbps=p2p or base.p2p_gbps,
        p2p_latency_ms=_median(p2p_lat) if p2p_lat else base.p2p_latency_ms,
        ce_gbps=max(ce_all) if ce_all else base.ce_gbps,
        symm_call_ms={**base.symm_call_ms, **host_ms},
        num_sms=torch.cuda.get_device_properties(device).multi_processor_count,
        key=key, source="measured", measured=tuple(measured),
        info={"gpu": name, "gpu_count": torch.cuda.device_count(), "world_size": world, **_versions(),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv)},
    )


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main(argv: list[str] | None = None) -> int:
    from .config import OverlapConfig

    p = argparse.ArgumentParser(prog="python -m overlap_backend.calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("--show", action="store_true", help="print the calibration the passes would use here; measure nothing")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--host", action="store_true",
                   help="also measure the symm ops' host time per call (symm_call_ms; run only with ranks sharing one GPU so far)")
    p.add_argument("--cache-dir", default=None, help="default: OVERLAP_CACHE_DIR, else ~/.cache/overlap_backend")
    args = p.parse_args(argv)
    cache_dir = args.cache_dir or OverlapConfig.from_env().cache_dir
    if args.show or not torch.cuda.is_available():
        if not args.show:
            print("no CUDA device: nothing to calibrate (the CPU/gloo defaults apply)", file=sys.stderr)
        cal = load_or_default(cache_dir)
        print(json.dumps(cal.to_json(), indent=2, sort_keys=True))
        return 0
    import torch.distributed as dist

    if "RANK" not in os.environ:
        print("run it with torchrun, one process per GPU: torchrun --nproc-per-node=<GPUs> -m overlap_backend.calibrate",
              file=sys.stderr)
        return 2
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl")
    try:
        cal = measure(args.reps, host=args.host)
        if int(os.environ.get("LOCAL_RANK", 0)) == 0:  # one writer per node (the same numbers everywhere)
            path = save(cal, cache_dir)
            print(json.dumps(cal.to_json(), indent=2, sort_keys=True))
            print(f"written: {path}", file=sys.stderr)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
