"""Shared helpers of the benchmarks: safe environment, process group, timing, machine info, tables.

Timing follows ``triton.testing.do_bench``: warm-up, then timed repetitions bracketed by CUDA
events, median. Collective benchmarks add what one process cannot see alone: every rank runs the
same number of repetitions (agreed through an all-reduce), the ranks meet at a barrier before each
measurement, and the reported time is the maximum over ranks of each rank's median.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

# NVLink multicast stays off on the shared GPU machines (a program using it can take the host's GPUs
# out of service). Set before torch/NCCL read them; the values are the ones those machines carry.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(SAFE_ENV)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- process group
def init_distributed(device_type: str) -> tuple[int, int, torch.device]:
    """Join the torchrun process group: NCCL with one GPU per rank, or gloo on the CPU."""
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device, timeout=timedelta(seconds=180))
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timedelta(seconds=180))
    stall_dump(rank)
    return rank, world_size, device


def stall_dump(rank: int) -> None:
    """``BENCH_STALL_DUMP_S=N``: every N seconds, each rank writes every thread's Python stack to
    stderr (``faulthandler``), so a run that stops printing shows where its host is waiting (a
    benchmark that printed nothing for minutes on 2xH200 left no other trace). Always: a crash
    (SIGSEGV, SIGABRT, ...) writes the Python stacks of every thread first (one rank of the MoE
    benchmark died of a SIGSEGV on 2xH200 with no trace)."""
    import faulthandler
    import sys

    faulthandler.enable(file=sys.stderr, all_threads=True)
    every = float(os.environ.get("BENCH_STALL_DUMP_S", "0") or 0)
    if every > 0:
        print(f"rank {rank}: Python stacks to stderr every {every:g} s (BENCH_STALL_DUMP_S)", file=sys.stderr)
        faulthandler.dump_traceback_later(every, repeat=True, file=sys.stderr)


def group_name(group=None) -> str:
    return (group or dist.group.WORLD).group_name


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def allreduce_max(values: Sequence[float], device: torch.device) -> list[float]:
    """Element-wise maximum over ranks (NaN stands for 'missing' and wins)."""
    if "gloo" in str(dist.get_backend()) and "cuda" not in str(dist.get_backend()):
        device = torch.device("cpu")  # gloo reduces CPU tensors (ranks sharing one GPU)
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
    nan = torch.isnan(t).to(torch.float64)
    t = torch.nan_to_num(t, nan=-math.inf)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    dist.all_reduce(nan, op=dist.ReduceOp.MAX)
    t[nan > 0] = math.nan
    return t.tolist()


# ----------------------------------------------------------------------------- timing
class Timing:
    """``bench(fn)``: max over ranks of each rank's median time of ``fn`` in ms (do_bench style)."""

    def __init__(self, device: torch.device, warmup_ms: float = 25.0, rep_ms: float = 100.0,
                 min_reps: int = 20, max_reps: int = 200, min_warmup: int = 3):
        self.device = device
        self.warmup_ms, self.rep_ms = warmup_ms, rep_ms
        self.min_reps, self.max_reps, self.min_warmup = min_reps, max_reps, min_warmup

    def _elapsed_ms(self, fn: Callable[[], object], n: int) -> list[float]:
        if self.device.type == "cuda":
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
            for s, e in zip(starts, ends):
                s.record()
                fn()
                e.record()
            torch.cuda.synchronize(self.device)
            return [s.elapsed_time(e) for s, e in zip(starts, ends)]
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return out

    def bench(self, fn: Callable[[], object]) -> tuple[float, int]:
        """(max over ranks of the per-rank median in ms, number of timed repetitions)."""
        # Estimate, then agree on the counts: every rank must call fn (a collective) equally often.
        fn()
        synchronize(self.device)
        dist.barrier()
        est = statistics.median(self._elapsed_ms(fn, 5))
        est = allreduce_max([est], self.device)[0]
        est = max(est, 1e-3)
        n_warmup = max(self.min_warmup, math.ceil(self.warmup_ms / est))
        n_reps = min(self.max_reps, max(self.min_reps, math.ceil(self.rep_ms / est)))
        for _ in range(n_warmup):
            fn()
        synchronize(self.device)
        dist.barrier()
        synchronize(self.device)
        median = statistics.median(self._elapsed_ms(fn, n_reps))
        return allreduce_max([median], self.device)[0], n_reps


def capture_graph(fn: Callable[[], object]) -> "torch.cuda.CUDAGraph":
    """``fn`` captured once in a CUDA graph, after two calls on a side stream (what capture needs:
    NCCL and the allocator warmed up off the capturing stream)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def events_ms(fn: Callable[[], object], n: int = 20, warm: int = 3) -> float:
    """Median CUDA-event time of ``fn`` in ms on this process alone (not collective, unlike
    ``Timing.bench``): for probes of one kernel on one GPU."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    return statistics.median(Timing(torch.device("cuda"))._elapsed_ms(fn, n))


_spin_cycles_per_ms: float | None = None


def _cycles_per_ms() -> float:
    """GPU clock cycles per ms of ``torch.cuda._sleep`` (measured once: the spin is what queues the calls)."""
    global _spin_cycles_per_ms
    if _spin_cycles_per_ms is None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1_000_000)  # (the clock ramps up)
        start.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        torch.cuda.synchronize()
        _spin_cycles_per_ms = 10_000_000 / max(start.elapsed_time(end), 1e-3)
    return _spin_cycles_per_ms


@dataclasses.dataclass
class QueuedTime:
    """``queued_ms``'s result: GPU ms per call (median), host µs to enqueue one call, and whether the
    spin outlasted the enqueueing (if not, ``fn`` waited on the GPU and the GPU time includes host time)."""

    ms: float
    host_us: float
    queued: bool


def queued_ms(fn: Callable[[], object], n: int = 20, warm: int = 3) -> QueuedTime:
    """Median GPU time of ``fn`` alone on this GPU, without the host's launch time in it: the ``n``
    timed calls (each between two CUDA events) are enqueued behind a GPU spin that outlasts their
    enqueueing, so that no call waits for the host to launch it, as under a CUDA graph. (Back-to-back
    event timing, ``events_ms``, measures max(GPU time, host time) per call: a kernel whose launch
    costs more host time than it runs reads as slow as its launch.)"""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    host_s = (time.perf_counter() - t0) / 3
    torch.cuda.synchronize()
    ms, queued, host_s = _behind_spin([fn] * n, host_s)
    return QueuedTime(statistics.median(ms), host_s * 1e6, queued)


def _behind_spin(calls: list[Callable[[], object]], host_s: float) -> tuple[list[float], bool, float]:
    """(ms of each of ``calls``, each between two CUDA events; whether the GPU spin they were enqueued behind
    outlasted their enqueueing; host s per call). The spin is sized from ``host_s`` (an estimate of the host's
    time per call) and, where it ran out before the last call was enqueued, from the time measured, up to
    three tries."""
    for _ in range(3):
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in calls]
        spun = torch.cuda.Event()
        torch.cuda._sleep(int((2e3 * host_s * len(calls) + 1.0) * _cycles_per_ms()))
        spun.record()
        t0 = time.perf_counter()
        for (s, e), call in zip(events, calls):
            s.record()
            call()
            e.record()
        host_s = (time.perf_counter() - t0) / len(calls)
        queued = not spun.query()
        torch.cuda.synchronize()
        if queued:
            break
    return [s.elapsed_time(e) for s, e in events], queued, host_s


@dataclasses.dataclass
class PairedTime:
    """``paired_queued_ms``'s result: ``fn``'s and the baseline's GPU ms per call (medians over the same
    sequence), the median of ``fn``'s per-call ratios to the baseline calls beside it, host µs to enqueue
    one call of ``fn``, and whether the spin outlasted the enqueueing (as ``QueuedTime``)."""

    ms: float
    baseline_ms: float
    ratio: float
    host_us: float
    queued: bool


def paired_queued_ms(fn: Callable[[], object], baseline: Callable[[], object], n: int = 20,
                     warm: int = 3) -> PairedTime:
    """``fn`` against ``baseline`` on this GPU, call by call: ``baseline, fn, baseline, ..., fn, baseline``
    (``n`` calls of ``fn``), each call between two CUDA events, all enqueued behind a GPU spin as in
    ``queued_ms``; each call of ``fn`` is divided by the mean of the two baseline calls around it. Under a
    sustained GEMM load the GPU's clock moves (power and thermal limits: the same cuBLAS GEMM took 0.60 ms
    and 0.69 ms a second later on an H100), so timings made one after the other compare clock states as
    much as kernels; neighbouring calls run at the same clock."""
    for _ in range(warm):
        baseline()
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    host_us = (time.perf_counter() - t0) / 3 * 1e6
    t0 = time.perf_counter()
    baseline()
    host_s = 0.5 * (host_us * 1e-6 + time.perf_counter() - t0)  # per call, the two alike
    torch.cuda.synchronize()
    ms, queued, _ = _behind_spin([baseline, fn] * n + [baseline], host_s)
    base, own = ms[0::2], ms[1::2]
    ratios = [t / (0.5 * (base[i] + base[i + 1])) for i, t in enumerate(own)]
    return PairedTime(statistics.median(own), statistics.median(base), statistics.median(ratios), host_us, queued)


def together_ms(fn: Callable[[], object], n: int = 10, warm: int = 0) -> float:
    """Median ms of one call of ``fn`` started on every rank at once (a barrier and a synchronize
    before each; CUDA events around it), max over ranks. For probes: a call's latency without
    back-to-back queueing, where ``Timing`` measures throughput."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return allreduce_max([times[n // 2]], torch.device("cuda", torch.cuda.current_device()))[0]


def shutdown() -> None:
    """End of a symm benchmark: every rank done, the symmetric buffers released (collectively),
    then the process group."""
    from overlap_backend.runtime import symm

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    dist.barrier()
    symm.release_all()
    dist.destroy_process_group()


def host_us(fn: Callable[[], object], device: torch.device, calls: int = 20, rounds: int = 5) -> float:
    """Host time per call of ``fn`` in microseconds: ``rounds`` bursts of ``calls`` calls that are not
    waited for (the GPU queue is deep enough not to push back), median burst, max over ranks."""
    fn()
    synchronize(device)
    bursts = []
    for _ in range(rounds):
        dist.barrier()
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        bursts.append((time.perf_counter() - t0) / calls * 1e6)
        synchronize(device)
    return allreduce_max([statistics.median(bursts)], device)[0]


TRACE_RANKS = (0, 1)  # the ranks whose profiler traces are written


def write_traces(variants: Sequence[tuple[str, Callable[[], object]]], trace_dir: Path, device: torch.device,
                 stem: str, warmup: int = 3) -> list[Path]:
    """One torch.profiler trace (Chrome/Perfetto JSON) of ONE call of each ``(name, fn)`` of
    ``variants`` after ``warmup`` calls, on ranks TRACE_RANKS: ``trace_dir/<stem>_<name>_rank<R>.json``.
    Every rank calls it (the calls are collective); the ranks start each traced call together."""
    from torch.profiler import ProfilerActivity, profile, record_function

    rank = dist.get_rank()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    written = []
    for name, fn in variants:
        for _ in range(warmup):
            fn()
        synchronize(device)
        dist.barrier()
        if rank in TRACE_RANKS:
            with profile(activities=activities) as prof:
                dist.barrier()  # inside the trace: the ranks start the traced call together
                synchronize(device)
                with record_function(f"bench {stem} {name}"):
                    fn()
                synchronize(device)
            path = trace_dir / f"{stem}_{name}_rank{rank}.json"
            prof.export_chrome_trace(str(path))
            written.append(path)
        else:
            dist.barrier()
            synchronize(device)
            fn()
            synchronize(device)
    dist.barrier()
    return written


def time_in_rounds(timed: Sequence[tuple[dict, Callable[[], object]]], rounds: int, timing: Timing) -> None:
    """Time the steps of ``timed`` (``[(row, step)]``) in ``rounds`` interleaved rounds (A, B, C, A,
    B, C, ...): each row collects its rounds' times in ``round_ms`` (after any it has), its steps in
    ``reps``, and gets their median as ``time_ms``. Interleaving keeps slow drifts of the machine
    (host speed, clocks) out of the comparison: one variant of the TP block moved by 30% between two
    one-after-the-other runs on 2xH200 (bench/results/epilogue_h200x2_2026-11-30/interleaved)."""
    for _ in range(rounds):
        for row, step in timed:
            ms, reps = timing.bench(step)
            row.setdefault("round_ms", []).append(ms)
            row["reps"] = (row.get("reps") or 0) + reps
    for row, _ in timed:
        if row.get("round_ms"):
            row["time_ms"] = statistics.median(row["round_ms"])


# ----------------------------------------------------------------------------- numerics
def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 (inf when out has a NaN/inf or the shapes differ)."""
    if out.shape != ref.shape:
        return math.inf
    out64, ref64 = out.double(), ref.double()
    if not torch.isfinite(out64).all():
        return math.inf
    den = ref64.norm().item()
    return (out64 - ref64).norm().item() / (den if den > 0 else 1.0)


# ----------------------------------------------------------------------------- machine info
def machine_info(device: torch.device, world_size: int) -> dict:
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "world_size": world_size,
        "device": device.type,
        "command": command_line(world_size),
        "env": {k: os.environ.get(k) for k in (*SAFE_ENV, "CUDA_VISIBLE_DEVICES")},
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception as e:  # noqa: BLE001
        info["triton"] = f"n/a ({type(e).__name__})"
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["gpu_count_visible"] = torch.cuda.device_count()
        info["cuda"] = torch.version.cuda
        try:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as e:  # noqa: BLE001
            info["nccl"] = f"n/a ({type(e).__name__})"
    else:
        info["gpu"] = "none (CPU, gloo)"
        info["gpu_count_visible"] = 0
    return info


def add_set_argument(parser) -> None:
    """``--set <set>.<KNOB>=value``: a tunable of ``overlap_backend.spec.knobs`` for this run (A/B runs of
    settings that have no environment variable), recorded in the result's command."""
    parser.add_argument("--set", action="append", default=[], metavar="SET.KNOB=VALUE",
                        help="set a knob before the run, e.g. cta.K_CHUNKS=8 (a set of overlap_backend.spec.knobs: "
                             "symm, cta, moe, runtime, codegen, passes, cost; value a Python literal); repeatable")


def apply_sets(items: Sequence[str]) -> list[str]:
    """Apply ``--set`` items (``symm.NAME=literal``) with ``knobs.set_from_text``; returns them as applied.
    Raises ValueError on an unknown set or knob, or a value of another type than the knob's default."""
    from overlap_backend.spec import knobs

    applied = []
    for item in items:
        try:
            dotted, value = knobs.set_from_text(item)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"--set {item!r}: {e.args[0] if e.args else e}") from None
        applied.append(f"{dotted}={value!r}")
    return applied


def parse_args_with_sets(parser, argv: Sequence[str] | None = None):
    """``parser.parse_args(argv)`` with the ``--set`` items (``add_set_argument``) applied and kept in
    ``args.settings``; a bad item ends the run with the parser's usage error."""
    args = parser.parse_args(argv)
    try:
        args.settings = apply_sets(args.set)
    except ValueError as e:
        parser.error(str(e))
    return args


def command_line(world_size: int) -> str:
    script = os.path.relpath(os.path.abspath(sys.argv[0]), os.getcwd())
    args = " ".join(shlex.quote(a) for a in sys.argv[1:])
    prefix = ""
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        prefix = f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']} "
    return f"{prefix}torchrun --nproc-per-node={world_size} {script} {args}".rstrip()


def info_markdown(info: dict) -> str:
    lines = [
        f"- date (UTC): {info['date']}",
        f"- machine: {info['host']}; {info['gpu_count_visible']} × {info['gpu']} visible, world size {info['world_size']}",
        f"- torch {info['torch']} (CUDA {info.get('cuda', 'n/a')}), triton {info['triton']}, "
        f"NCCL {info.get('nccl', 'n/a')}, python {info['python']}",
        f"- env: {', '.join(f'{k}={v}' for k, v in info['env'].items())}",
        f"- command: `{info['command']}`",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- block sizes
def env_world_size() -> int:
    """The world size torchrun gives this process (1 outside torchrun): for defaults parsed before the
    process group exists."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def cpu_block_sizes(ws: int) -> dict:
    """The CPU smoke tests' tiny TP block (bench_block.py, bench_epilogue.py): 4 heads up to 4 ranks,
    one head per rank beyond (heads must split over the ranks)."""
    return dict(batch=2, seq=32, hidden=64, heads=4 if ws <= 4 else ws, ffn=128, dtype="float32")


def block_sizes_problem(seq: int, hidden: int, heads: int | None, ffn: int, ws: int) -> str | None:
    """Why a TP block (models.TPBlock: sequence, heads and ffn split over ``ws`` ranks; ``heads`` None:
    a block without attention, models.TPSwiGLUMlp) of these sizes cannot run on ``ws`` ranks (None: it can)."""
    dims = (("seq", seq), ("heads", heads), ("ffn", ffn))
    bad = [f"{name} {v}" for name, v in dims if v is not None and v % ws]
    why = [f"{', '.join(bad)} not divisible by the world size {ws}"] if bad else []
    if heads is not None and hidden % heads:
        why.append(f"hidden {hidden} not divisible by heads {heads}")
    return "; ".join(why) or None


# ----------------------------------------------------------------------------- tables
def fmt_ms(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:.3f}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    def line(r):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), sep] + [line(r) for r in cells[1:]])


def write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def print_versions() -> None:
    """What bench/run_device.sh prints first: python, torch, CUDA, triton, NCCL, GPUs, safety env."""
    print("python", platform.python_version(), sys.executable)
    print("torch", torch.__version__, "CUDA", torch.version.cuda)
    try:
        import triton

        print("triton", triton.__version__)
    except Exception as e:  # noqa: BLE001
        print("triton n/a:", e)
    if torch.cuda.is_available():
        print("NCCL", ".".join(map(str, torch.cuda.nccl.version())))
        n = torch.cuda.device_count()
        print("GPUs", n, [torch.cuda.get_device_name(i) for i in range(n)])
    else:
        print("CUDA is not available")
    print("NCCL available:", dist.is_nccl_available())
    for k in (*SAFE_ENV, "CUDA_VISIBLE_DEVICES", "PYTHONPATH"):
        print(f"{k}={os.environ.get(k)}")


def exit_now(code: int) -> None:
    """End a benchmark whose results are written and whose process group is gone: flush and skip
    interpreter teardown, where freeing symmetric-memory buffers, CUDA state or compile workers could
    hang a run that has nothing left to do."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    print_versions()
