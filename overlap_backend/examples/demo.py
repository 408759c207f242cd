"""End-to-end demo: a sequence-parallel transformer block, eager vs Inductor vs the overlap backend.

    python -m overlap_backend.examples.demo                       # 2 gloo ranks on CPU, or one rank per GPU (NCCL)
    python -m overlap_backend.examples.demo --world-size 4 --no-inductor --skip-inductor-baseline

Each rank builds the same :class:`~overlap_backend.models.TPBlock` (same seed), runs it eagerly
(forward + backward) as the reference, compiles it with the overlap backend and checks the output,
the input gradient and every weight gradient against eager, compiles it with plain Inductor for the
baseline, and times forward + backward steps of all three. Rank 0 prints every match the backend
saw (applied or not, and why), the numerics, and the step times. The exit code is non-zero when a
numerics check fails, an expected rewrite is missing, or a rank fails.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import sys
import tempfile
import time
import traceback
from datetime import timedelta

import torch

from ..tools.spawn import collect, dump_stacks_on_signal

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Relative error against eager that a correct compile stays under. bf16 (unit roundoff 2**-8 = 3.9e-3):
# plain Inductor itself reaches 1.4e-2 on this block's LayerNorm gradients (CPU, default sizes, seeds 0-2:
# 1.28e-2, 1.40e-2, 1.13e-2) and 7.7e-3 on 4xH200, so bf16 gets ~8 unit roundoffs, twice the worst seen.
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}

# Default problem sizes: small enough for ~2-3 minutes on a 2-core CPU with Inductor's C++
# codegen; on GPUs a Llama-3-8B-sized block (fits easily in an H200 per rank).
CPU_DEFAULTS = dict(batch=2, seq=64, hidden=128, heads=4, ffn=256, steps=5, dtype="float32")
GPU_DEFAULTS = dict(batch=4, seq=2048, hidden=4096, heads=32, ffn=14336, steps=20, dtype="bfloat16")

_MATMUL_NAME = re.compile(r"^(add)?mm(_\d+)?$")


# ------------------------------------------------------------------------------------ arguments
def _int_at_least(lo: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < lo:
            raise argparse.ArgumentTypeError(f"must be an integer >= {lo}, got {text}")
        return value

    return parse


TIMEOUT_MAX_S = 1e9  # what timedelta (the process group's timeout) and the wait loop hold with room to spare


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= TIMEOUT_MAX_S:  # NaN fails too
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0 and <= {TIMEOUT_MAX_S:g}, got {text}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m overlap_backend.examples.demo",
        description="Sequence-parallel transformer block: eager vs Inductor vs the overlap backend.",
    )
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: one GPU per rank with NCCL when >= 2 GPUs are visible, else CPU with gloo")
    p.add_argument("--world-size", type=int, default=None,
                   help="ranks, >= 2 (default: the number of visible GPUs if >= 2, else 2)")
    positive = _int_at_least(1)
    p.add_argument("--batch", type=positive)
    p.add_argument("--seq", type=positive, help="full sequence length (each rank holds seq / world-size)")
    p.add_argument("--hidden", type=positive)
    p.add_argument("--heads", type=positive)
    p.add_argument("--ffn", type=positive)
    p.add_argument("--dtype", choices=tuple(DTYPES), help="default: bfloat16 on GPU, float32 on CPU")
    p.add_argument("--steps", type=positive, help="timed steps (default: 20 on GPU, 5 on CPU)")
    p.add_argument("--warmup", type=_int_at_least(0), default=2, help="untimed steps before timing each variant")
    p.add_argument("--lowering", choices=("auto", "symm", "p2p"), default=None,
                   help="lowering of the rewritten ops (default: OVERLAP_LOWERING or auto)")
    p.add_argument("--no-inductor", action="store_true",
                   help="run the overlap backend's rewritten graphs without Inductor codegen (fast)")
    p.add_argument("--skip-inductor-baseline", action="store_true",
                   help="do not compile/time the plain Inductor baseline")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=_timeout, default=1800, help="seconds before the demo gives up on the ranks")
    args = p.parse_args(argv)

    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.device == "auto":
        args.device = "cuda" if n_gpus >= 2 else "cpu"
    if args.device == "cuda" and n_gpus < 1:
        p.error("--device cuda: no CUDA device is visible")
    if args.world_size is None:
        args.world_size = n_gpus if args.device == "cuda" and n_gpus >= 2 else 2
    if args.world_size < 2:  # one rank has nothing to communicate: the backend leaves its graphs alone
        p.error(f"--world-size {args.world_size}: the demo needs >= 2 ranks (one rank communicates nothing, so "
                f"there is nothing to overlap)")
    if args.device == "cuda" and args.world_size > n_gpus:
        p.error(f"--world-size {args.world_size} > {n_gpus} visible GPUs (one GPU per rank)")
    for key, value in (GPU_DEFAULTS if args.device == "cuda" else CPU_DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    ws = args.world_size
    uneven = [f"--{name} {getattr(args, name)}" for name in ("seq", "heads", "ffn") if getattr(args, name) % ws]
    if uneven:
        p.error(f"{' and '.join(uneven)} must be divisible by --world-size {ws} (each rank holds an equal share)")
    if args.hidden % args.heads:
        p.error(f"--hidden {args.hidden} must be divisible by --heads {args.heads}")
    return args


# ------------------------------------------------------------------------------------ numerics
def rel_err(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    """``||a - b|| / ||b||`` in float64; inf when a tensor is missing or shapes differ; NaN stays NaN."""
    if a is None or b is None or a.shape != b.shape:
        return math.inf
    a, b = a.detach().double(), b.detach().double()
    diff, ref = (a - b).norm().item(), b.norm().item()
    if ref == 0:
        return 0.0 if diff == 0 else math.inf
    return diff / ref


def passes(err: float, tol: float) -> bool:
    return math.isfinite(err) and err <= tol  # NaN never passes


# ---------------------------------------------------------------------------------- one rank
def fwd_bwd(model, x, grad_out):
    x.grad = None
    for p in model.parameters():
        p.grad = None
    out = model(x)
    out.backward(grad_out)
    return out


def _time_steps(model, x, grad_out, steps: int, warmup: int, device: torch.device) -> list[float]:
    import torch.distributed as dist

    for _ in range(warmup):
        fwd_bwd(model, x, grad_out)
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        dist.barrier()
        for _ in range(steps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fwd_bwd(model, x, grad_out)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        dist.barrier()
        for _ in range(steps):
            t0 = time.perf_counter()
            fwd_bwd(model, x, grad_out)
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def _check(model, x, grad_out, ref_out, ref_x, ref_model) -> dict[str, float]:
    """Forward + backward of ``model``; relative error of each result against the eager reference."""
    xc = x.detach().clone().requires_grad_()
    out = fwd_bwd(model, xc, grad_out)
    errs = {"output": rel_err(out, ref_out), "input grad": rel_err(xc.grad, ref_x.grad)}
    ref_params = dict(ref_model.named_parameters())
    for name, p in model.named_parameters():
        name = name.removeprefix("_orig_mod.")  # torch.compile's wrapper
        errs[f"grad {name}"] = rel_err(p.grad, ref_params[name].grad)
    return errs


def _cache_counts() -> dict[str, int]:
    """Inductor's cache hits and misses so far in this process (the overlap backend keeps both caches on)."""
    from torch._dynamo.utils import counters

    return {"fx hit": counters["inductor"]["fxgraph_cache_hit"], "fx miss": counters["inductor"]["fxgraph_cache_miss"],
            "aot hit": counters["aot_autograd"]["autograd_cache_hit"],
            "aot miss": counters["aot_autograd"]["autograd_cache_miss"]}


def run_rank(rank: int, ws: int, args: argparse.Namespace, device: torch.device) -> dict:
    import torch.distributed as dist

    import overlap_backend
    from overlap_backend.models import TPBlock

    dtype = DTYPES[args.dtype]
    group = dist.group.WORLD

    def block():
        return TPBlock(args.hidden, args.heads, args.ffn, group=group, dtype=dtype, device=device, seed=args.seed)

    # Fresh random data, the same full tensors on every rank; each rank keeps its sequence shard.
    gen = torch.Generator(device=device).manual_seed(args.seed + 1)
    full = (args.batch, args.seq, args.hidden)
    x_full = torch.randn(full, generator=gen, device=device, dtype=torch.float32).to(dtype)
    g_full = torch.randn(full, generator=gen, device=device, dtype=torch.float32).to(dtype)
    x = x_full.chunk(ws, dim=1)[rank].contiguous()
    grad_out = g_full.chunk(ws, dim=1)[rank].contiguous()

    # Eager reference.
    eager = block()
    ref_x = x.detach().clone().requires_grad_()
    ref_out = fwd_bwd(eager, ref_x, grad_out)

    # Overlap backend.
    overrides = {}
    if args.lowering is not None:
        overrides["lowering"] = args.lowering
    if args.no_inductor:
        overrides["inductor"] = False
    backend = overlap_backend.make_backend(**overrides)
    overlapped = torch.compile(block(), backend=backend)
    before = _cache_counts()
    t0 = time.perf_counter()
    errs_overlap = _check(overlapped, x, grad_out, ref_out, ref_x, eager)
    compile_s = {"overlap": time.perf_counter() - t0}
    caches = {k: v - before[k] for k, v in _cache_counts().items()}

    # Plain Inductor baseline.
    errs_inductor = None
    inductor = None
    if not args.skip_inductor_baseline:
        inductor = torch.compile(block(), backend="inductor")
        t0 = time.perf_counter()
        errs_inductor = _check(inductor, x, grad_out, ref_out, ref_x, eager)
        compile_s["inductor"] = time.perf_counter() - t0

    # Step times.
    variants = [("eager", eager), ("inductor", inductor), ("overlap", overlapped)]
    times = {}
    for name, model in variants:
        if model is None:
            continue
        xt = x.detach().clone().requires_grad_()
        times[name] = _time_steps(model, xt, grad_out, args.steps, args.warmup, device)

    return {
        "rank": rank,
        "errs_overlap": errs_overlap,
        "errs_inductor": errs_inductor,
        "times": times,
        "compile_s": compile_s,
        "caches": caches,
        "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "reports": [r.to_json() for r in backend.reports],
        "config": {"inductor": backend.config.inductor, "lowering": backend.config.lowering,
                   "passes": list(backend.config.passes), "disable": backend.config.disable},
    }


# ------------------------------------------------------------------------------------ report
def _matmuls(nodes: list[str]) -> list[str]:
    return [n for n in nodes if _MATMUL_NAME.match(n)]


def _expectations(result: dict) -> list[tuple[str, bool | None]]:
    """The rewrites the demo exists to show: (description, found); None when the config rules it out."""
    cfg = result["config"]
    fwd = [m for g in result["reports"] if g["kind"] == "forward" for m in g["matches"] if m["applied"]]
    ag = [len(_matmuls(m["nodes"])) for m in fwd if m["pass"] == "ag_mm"]
    rs = [m for m in fwd if m["pass"] == "mm_rs"]

    def wanted(pass_name: str, found: bool):
        return None if cfg["disable"] or pass_name not in cfg["passes"] else found

    return [
        ("forward ag_mm: one gather feeding Q, K, V (3 matmuls)", wanted("ag_mm", any(n >= 3 for n in ag))),
        ("forward ag_mm: gather feeding fc1", wanted("ag_mm", len(ag) >= 2)),
        ("forward mm_rs: out-proj and fc2 (2 matmuls + reduce-scatter)", wanted("mm_rs", len(rs) >= 2)),
    ]


def _decisions(result: dict) -> list:
    return [(g["kind"], m["pass"], m["applied"], m["reason"]) for g in result["reports"] for m in g["matches"]]


def print_report(args: argparse.Namespace, results: list[dict], device_desc: str) -> bool:
    from tabulate import tabulate

    ok = True
    r0 = results[0]
    cfg = r0["config"]
    print()
    print(f"overlap_backend demo: TPBlock (sequence parallel), {args.world_size} ranks on {device_desc}, {args.dtype}")
    print(f"  batch={args.batch} seq={args.seq} hidden={args.hidden} heads={args.heads} ffn={args.ffn} "
          f"steps={args.steps} (warm-up {args.warmup})")
    print(f"  overlap backend: inductor={cfg['inductor']} lowering={cfg['lowering']} passes={','.join(cfg['passes'])}"
          f"{' DISABLED' if cfg['disable'] else ''}")

    # Matches.
    rows = []
    for g in r0["reports"]:
        if not g["matches"]:
            rows.append([g["id"], g["kind"], "-", "-", "-", "-", "no pattern found"])
        for m in g["matches"]:
            rows.append([g["id"], g["kind"], m["pass"], "yes" if m["applied"] else "no", m["lowering"] or "-",
                         ", ".join(_matmuls(m["nodes"])) or "-", m["reason"]])
    print("\nMatches seen by the overlap backend (rank 0):")
    headers = ["graph", "kind", "pass", "applied", "lowering", "matmuls", "reason"]
    print(tabulate(rows, headers=headers, disable_numparse=True))
    same = all(_decisions(r) == _decisions(r0) for r in results)
    print(f"rewrite decisions identical on all ranks: {'yes' if same else 'NO'}")
    ok &= same

    print("\nExpected rewrites:")
    for desc, found in _expectations(r0):
        status = "skipped (pass disabled)" if found is None else ("OK" if found else "MISSING")
        print(f"  {desc}: {status}")
        ok &= found is not False

    # Numerics: worst rank per tensor.
    tol = TOLERANCE[DTYPES[args.dtype]]
    rows = []
    for name in r0["errs_overlap"]:
        err, worst = max((r["errs_overlap"][name], r["rank"]) for r in results)
        if any(math.isnan(r["errs_overlap"][name]) for r in results):
            err = math.nan
        good = passes(err, tol)
        ok &= good
        row = [name, f"{err:.2e}", worst]
        status = "OK" if good else "FAIL"
        if r0["errs_inductor"] is not None:
            ind = max(r["errs_inductor"][name] for r in results)
            row.append(f"{ind:.2e}")
            if not good and not passes(ind, tol):
                status = "FAIL (plain Inductor fails too)"
        rows.append(row + [f"{tol:.0e}", status])
    headers = ["tensor", "overlap rel err", "worst rank"]
    if r0["errs_inductor"] is not None:
        headers.append("inductor rel err (info)")
    print("\nNumerics vs eager (relative error ||a-b||/||b||, worst over ranks):")
    print(tabulate(rows, headers=headers + ["tolerance", "status"], disable_numparse=True))

    # Step times: median over steps, slowest rank.
    rows = []
    eager_ms = None
    for name in ("eager", "inductor", "overlap"):
        if name not in r0["times"]:
            continue
        med = max(statistics.median(r["times"][name]) for r in results)
        lo = max(min(r["times"][name]) for r in results)
        eager_ms = med if name == "eager" else eager_ms
        compile_s = max(r["compile_s"].get(name, 0.0) for r in results)
        rows.append([name, f"{med:.3f}", f"{lo:.3f}", f"{eager_ms / med:.2f}x",
                     f"{compile_s:.1f}" if name != "eager" else "-"])
    print(f"\nForward+backward step time (ms; median of {args.steps} steps, slowest rank):")
    headers = ["variant", "median ms", "min ms", "speed-up vs eager", "first call s (compile)"]
    print(tabulate(rows, headers=headers, disable_numparse=True))
    c = r0["caches"]
    print(f"  overlap backend's compile on rank 0: Inductor's FX-graph cache {c['fx hit']} hits / {c['fx miss']} misses, "
          f"AOT-autograd cache {c['aot hit']} hits / {c['aot miss']} misses")
    if r0["peak_gib"] is not None:
        print(f"  peak GPU memory allocated: {max(r['peak_gib'] for r in results):.1f} GiB (largest rank)")
    if args.device == "cpu":
        print("  (CPU + gloo: the collectives and the p2p ring run on the same cores as the GEMMs,"
              " so these times show overhead, not overlap)")
    print(f"\nRESULT: {'PASS' if ok else 'FAIL'}")
    return ok


# --------------------------------------------------------------------------------- processes
def _worker(rank: int, ws: int, store_path: str, args: argparse.Namespace, results) -> None:
    dump_stacks_on_signal()
    try:
        import torch.distributed as dist

        if args.device == "cpu":
            torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
            device, backend, kwargs = torch.device("cpu"), "gloo", {}
        else:
            device, backend = torch.device("cuda", rank), "nccl"
            torch.cuda.set_device(device)
            kwargs = {"device_id": device}
        store = dist.FileStore(store_path, ws)
        dist.init_process_group(backend, store=store, rank=rank, world_size=ws,
                                timeout=timedelta(seconds=max(600, args.timeout)), **kwargs)
        try:
            result = run_rank(rank, ws, args, device)
            gathered = [None] * ws
            dist.all_gather_object(gathered, result)
            ok = True
            if rank == 0:
                desc = "CPU (gloo)" if device.type == "cpu" else f"{torch.cuda.get_device_name(device)} (NCCL)"
                ok = print_report(args, gathered, desc)
                sys.stdout.flush()
            dist.barrier()
        finally:
            dist.destroy_process_group()
        results.put((rank, True, ok))  # the rank finished; ok: its numerics passed
    except BaseException:  # noqa: BLE001 - the parent reports it
        results.put((rank, False, traceback.format_exc()))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ws = args.world_size
    if args.device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        os.environ["OMP_NUM_THREADS"] = str(max(1, cores // ws))
    import torch.multiprocessing as tmp

    ctx = tmp.get_context("spawn")
    results = ctx.Queue()
    start = time.perf_counter()
    print(f"spawning {ws} ranks on {args.device} "
          f"({'NCCL' if args.device == 'cuda' else 'gloo, OMP_NUM_THREADS=' + os.environ.get('OMP_NUM_THREADS', '?')})",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="overlap_demo_") as tmpdir:
        store_path = os.path.join(tmpdir, "store")
        procs = [ctx.Process(target=_worker, args=(r, ws, store_path, args, results), daemon=True) for r in range(ws)]
        for p in procs:
            p.start()
        done, errors = collect(procs, results, args.timeout)
    wall = time.perf_counter() - start
    for e in errors:
        print(e, file=sys.stderr)
    ok = not errors and len(done) == ws and all(done.values())
    print(f"demo wall time: {wall:.1f} s; exit {'0' if ok else '1'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
