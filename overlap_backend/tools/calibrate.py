"""Measure this machine for the cost model and write its calibration file (``cost/calibration.py``).

On GPUs, once per machine and software stack::

    torchrun --nproc-per-node=<GPUs> -m overlap_backend.tools.calibrate    # writes the cache file
    python -m overlap_backend.tools.calibrate --show                        # what the passes would use

Every rank measures the GEMM rates and memory bandwidth; groups of 2, 4, ... ranks the NCCL and ring
bandwidths and latencies; with ``--host`` the ``symm`` ops' host time per call (:func:`measure_host`).
The file goes to the calibration cache (``OVERLAP_CACHE_DIR`` or ``--cache-dir``) under this machine's
key; the passes load it when they compile (nothing is measured then).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Any

import torch

from ..config import OverlapConfig
from ..cost.calibration import DEFAULTS, Calibration, device_class, load_or_default, local_key, local_versions, save
from ..spec import knobs


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
        from ..runtime import symm

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
        # the knobs the host times were measured with (symm_call_ms runs our ops; the rest does not depend on them)
        info={"gpu": name, "gpu_count": torch.cuda.device_count(), "world_size": world, **local_versions(),
              "knobs_hash": knobs.knobs_hash(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "command": " ".join(sys.argv)},
    )


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m overlap_backend.tools.calibrate", description=__doc__.split("\n\n")[0])
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
        print("run it with torchrun, one process per GPU: torchrun --nproc-per-node=<GPUs> -m overlap_backend.tools.calibrate",
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
