"""GEMM + collective benchmark: cuBLAS, NCCL, torch async-TP / symmetric memory, and ours.

    torchrun --nproc-per-node=N bench/suites/bench_collective_gemm.py --suite ag_mm,mm_rs,mm_ar --out-dir DIR
        [--lowerings p2p,symm] [--graphs] [--trace TRACE_DIR [--trace-m 4096]] [--quick]

For each suite and shape (the baseline tables measured on 4×H200, docs/results.md, plus a decode-size M=512 row for ag_mm and
mm_rs) it times, in bf16, with CUDA events (warm-up, >= 20 timed repetitions, median per rank, max
over ranks; a barrier before each measurement; every variant once, then ``--rounds`` (2) more rounds over
them interleaved, a variant's time the median of its timings):

- ``mm``: cuBLAS ``torch.mm`` alone on the full local problem;
- ``comm``: the NCCL collective alone;
- ``seq``: the NCCL collective then the matmul (ag_mm), or the matmul then the collective;
- torch's own fused ops: async-TP ``symm_mem.fused_all_gather_matmul`` /
  ``fused_matmul_reduce_scatter``; for all-reduce the symmetric-memory one-shot / two-shot
  all-reduce on a ``symm_mem.empty`` buffer, alone and after the matmul (``n/a: reason`` when the
  installed torch cannot run them);
- ``ours_p2p`` / ``ours_symm``: ``torch.ops.overlap.<suite>(..., lowering="p2p" / "symm")``, each
  checked first against NCCL + a float32 matmul on fresh random inputs (relative error <= 1e-2 in
  bf16, no NaN: else FAIL); ``n/a: reason`` when the lowering is not registered for the op;
- ``max(mm, comm)``: the time a perfect overlap would take; ``speedup`` = seq / ours; for symm also
  ``symm / max(mm, comm)`` and ``async-TP / symm`` (the target: <= 1.10 and >= 1.15).

With ``--graphs`` each timed variant except ours on ``p2p`` is also captured once in a CUDA graph
(after its eager timing, which warmed it up) and its replays are timed: the GPU time without the
host's, as under ``torch.compile(mode="reduce-overhead")``; a second table gives those times and the
bar's ratios on them. A variant is replayed only if every rank captured it (``n/a`` otherwise).

Rank 0 writes ``DIR/<suite>_ws<N>.md`` (machine info + table) and ``DIR/<suite>_ws<N>.json``,
rewritten after every row so that an interrupted run keeps what it measured. With ``--trace``,
after ALL timing is done, one torch.profiler trace of one call per variant (seq, torch's fused op,
ours p2p, ours symm) and traced row goes to ``TRACE_DIR/<suite>_ws<N>_M<M>_<variant>_rank<R>.json``
(ranks 0 and 1 only). See bench/README.md.
"""

from __future__ import annotations

import argparse
import gc
import logging
import math
import sys
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # repo root: overlap_backend, bench

from bench.tools import common  # noqa: E402  (sets the NVLink-multicast-off environment first)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import overlap_backend  # noqa: E402,F401  registers torch.ops.overlap.*

# dist.reduce_scatter_tensor is NCCL's own name for the collective; its deprecation notice is noise here.
warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")

SUITES = ("ag_mm", "mm_rs", "mm_ar")
LOWERINGS = ("p2p", "symm")  # ours, in column order; --lowerings picks a subset
TOL = {torch.bfloat16: 1e-2, torch.float16: 1e-2, torch.float32: 1e-4}
# The symm lowering's target: symm <= 1.10 x max(mm, comm) and >= 1.15x faster than torch.
BAR_MAX_RATIO, BAR_TORCH_RATIO = 1.10, 1.15
TRACE_WARMUP = 3  # calls of a variant right before its traced call


def ours_key(lowering: str) -> str:
    return f"ours_{lowering}"


@dataclass(frozen=True)
class Shape:
    M: int
    K: int
    N: int
    origin: str  # where the row comes from: "DESIGN ws=4", "decode", "adapted from ws=4", ...


# Global problem sizes of the baseline tables measured on 4×H200 (docs/results.md), keyed by the world size measured there.
#   ag_mm: A shard [M/ws, K] gathered to [M, K], B [K, N]
#   mm_rs: A [M, K/ws] @ B [K/ws, N] -> [M, N], reduce-scattered over M
#   mm_ar: A [M, K] @ B [K, N] per rank, all-reduced (sizes do not depend on ws)
TABLE = {
    "ag_mm": [(4, 4096, 8192, 7168), (4, 8192, 8192, 7168), (4, 16384, 8192, 2048), (2, 8192, 8192, 14336)],
    "mm_rs": [(4, 4096, 7168, 8192), (4, 8192, 7168, 8192), (4, 16384, 2048, 8192)],
    "mm_ar": [(4, 128, 7168, 8192), (4, 1024, 7168, 8192), (4, 4096, 7168, 8192), (4, 8192, 7168, 8192)],
}
DECODE = {"ag_mm": (512, 8192, 7168), "mm_rs": (512, 7168, 8192)}
CPU_SCALE = 64  # --device cpu: every dimension divided by this (gloo smoke test)


def select_shapes(suite: str, ws: int, quick: bool, cpu: bool) -> list[Shape]:
    rows: list[Shape] = []
    if suite in DECODE:
        rows.append(Shape(*DECODE[suite], "decode"))
    if suite == "mm_ar":
        rows += [Shape(M, K, N, "DESIGN ws=4" if ws == 4 else "DESIGN ws=4, per-rank sizes") for _, M, K, N in TABLE[suite]]
    else:
        native = [Shape(M, K, N, f"DESIGN ws={w}") for w, M, K, N in TABLE[suite] if w == ws]
        # No measured row for this ws (or ws=2 with only one): the ws=4 global problems split ws ways.
        adapted = [] if ws == 4 else [Shape(M, K, N, "adapted from ws=4") for w, M, K, N in TABLE[suite] if w == 4]
        rows += native + adapted
    if cpu:
        rows = [Shape(max(s.M // CPU_SCALE, ws), max(s.K // CPU_SCALE, ws), max(s.N // CPU_SCALE, 1), s.origin) for s in rows]
    # Sizes that ws does not divide are left out (none at ws = 2, 4, 8; e.g. K=7168 at ws=16 on the CPU).
    rows = [s for s in rows if all(getattr(s, d) % ws == 0 for d in SPLIT[suite])]
    return rows[:2] if quick else rows


# The global dimensions split ws ways: ag_mm gathers A's rows (M); mm_rs splits the contraction (K)
# and scatters the output's rows (M); mm_ar's sizes are per rank (nothing split).
SPLIT = {"ag_mm": ("M",), "mm_rs": ("M", "K"), "mm_ar": ()}


def local_shapes(suite: str, s: Shape, ws: int) -> dict[str, tuple[int, int]]:
    """What each of the ws ranks holds (A, B) and gets back (out) for one global problem."""
    if suite == "ag_mm":
        return {"A": (s.M // ws, s.K), "B": (s.K, s.N), "out": (s.M, s.N)}
    if suite == "mm_rs":
        return {"A": (s.M, s.K // ws), "B": (s.K // ws, s.N), "out": (s.M // ws, s.N)}
    return {"A": (s.M, s.K), "B": (s.K, s.N), "out": (s.M, s.N)}


def list_shapes(ws: int, suites=SUITES, quick: bool = False, cpu: bool = False) -> list[dict]:
    """Every row a run at world size ``ws`` takes, with the per-rank operands (no GPU, no process group)."""
    return [{"suite": suite, "M": s.M, "K": s.K, "N": s.N, "origin": s.origin, **local_shapes(suite, s, ws)}
            for suite in suites for s in select_shapes(suite, ws, quick, cpu)]


# ------------------------------------------------------------------------------ one variant
class Runner:
    """Times variants of one shape; a variant that raises is recorded as ``n/a: reason``.

    ``fns`` keeps every callable that was timed successfully, for ``--trace`` after all timing.
    """

    def __init__(self, timing: common.Timing, verbose: bool):
        self.timing = timing
        self.verbose = verbose
        self.times: dict[str, float | None] = {}
        self.notes: dict[str, str] = {}
        self.reps: dict[str, int] = {}
        self.fns: dict[str, object] = {}
        self.round_ms: dict[str, list[float]] = {}

    def run(self, key: str, fn) -> None:
        try:
            ms, reps = self.timing.bench(fn)
            self.times[key], self.reps[key] = ms, reps
            self.fns[key] = fn
        except Exception as e:  # noqa: BLE001 - a baseline this torch cannot run is reported, not fatal
            self.na(key, _short(e, 200))
            if self.verbose:
                traceback.print_exc()

    def na(self, key: str, reason: str) -> None:
        self.times[key] = None
        self.notes[key] = f"n/a: {reason}"

    def interleave(self, rounds: int) -> None:
        """``rounds`` more timings of every variant that every rank timed, in interleaved rounds
        (``common.time_in_rounds``): a variant's time is the median of its first timing and those, so a
        drift of the machine (the GPUs' clocks under a sustained load) falls alike on every variant."""
        if rounds <= 0:
            return
        keys = [k for k in self.fns if self.times.get(k) is not None]
        if dist.is_initialized() and dist.get_world_size() > 1:  # (each timing is collective: the same keys)
            everyone = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, keys)
            keys = [k for k in keys if all(k in other for other in everyone)]
        rows = {k: {"round_ms": [self.times[k]], "reps": self.reps[k]} for k in keys}
        common.time_in_rounds([(rows[k], self.fns[k]) for k in keys], rounds, self.timing)
        for k, row in rows.items():
            self.times[k], self.reps[k], self.round_ms[k] = row["time_ms"], row["reps"], row["round_ms"]


def _short(e: BaseException, n: int = 160) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"[:n]


def _randn(shape, dtype, device, scale=1.0):
    return (torch.randn(shape, device=device, dtype=torch.float32) * scale).to(dtype)


def _enable_symm_mem(gn: str) -> None:
    # Needed by older torch for the async-TP ops, deprecated later. A failure here shows up as the
    # op's own error ("n/a: ...") when it is timed.
    try:
        from torch.distributed import _symmetric_memory as symm_mem

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if hasattr(symm_mem, "enable_symm_mem_for_group"):
                symm_mem.enable_symm_mem_for_group(gn)
    except Exception as e:  # noqa: BLE001
        print(f"enable_symm_mem_for_group: {type(e).__name__}: {e}", file=sys.stderr)


# ------------------------------------------------------------------------------ ours, and its checks
def ours_fn(suite: str, lowering: str, t: dict, gn: str):
    """The call of ours on the tensors ``t`` of a suite (see the bench_* and check_* functions)."""
    ops = torch.ops.overlap
    if suite == "ag_mm":
        return lambda: ops.ag_mm(t["shard"], [t["b"]], [None], 0, gn, lowering, False)
    if suite == "mm_rs":
        return lambda: ops.mm_rs(t["a"], t["b"], None, [t["M"], t["N"]], 0, "sum", gn, lowering)
    return lambda: ops.mm_ar(t["a"], t["b"], None, "sum", gn, lowering)


def check_ag_mm(M, K, N, ws, dtype, device, gn, lowering) -> float:
    shard = _randn((M // ws, K), dtype, device)
    b = _randn((K, N), dtype, device, K**-0.5)
    _, outs = ours_fn("ag_mm", lowering, {"shard": shard, "b": b}, gn)()
    full = torch.empty((M, K), dtype=dtype, device=device)
    dist.all_gather_into_tensor(full, shard)
    return common.rel_err(outs[0], full.float() @ b.float())


def check_mm_rs(M, K, N, ws, dtype, device, gn, lowering) -> float:
    a = _randn((M, K // ws), dtype, device)
    b = _randn((K // ws, N), dtype, device, (K // ws) ** -0.5)
    out = ours_fn("mm_rs", lowering, {"a": a, "b": b, "M": M, "N": N}, gn)()
    ref = torch.empty((M // ws, N), dtype=torch.float32, device=device)
    dist.reduce_scatter_tensor(ref, a.float() @ b.float())
    return common.rel_err(out, ref)


def check_mm_ar(M, K, N, ws, dtype, device, gn, lowering) -> float:
    a = _randn((M, K), dtype, device)
    b = _randn((K, N), dtype, device, K**-0.5)
    out = ours_fn("mm_ar", lowering, {"a": a, "b": b}, gn)()
    ref = a.float() @ b.float()
    dist.all_reduce(ref)
    return common.rel_err(out, ref)


CHECKS = {"ag_mm": check_ag_mm, "mm_rs": check_mm_rs, "mm_ar": check_mm_ar}

# Exceptions by which a lowering says "I do not handle this" (not registered, shape or machine
# unsupported): reported as n/a, not as a failure. Anything else raised by ours is an ERROR.
_UNSUPPORTED = tuple(c for c in (overlap_backend.runtime.LoweringError, NotImplementedError,
                                 getattr(getattr(overlap_backend.runtime, "symm", None), "SymmUnavailable", None))
                     if c is not None)


class _SymmFallbackLog(logging.Handler):
    """Collects why the symm lowering ran an op on its p2p fallback (it logs each reason once)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.why: dict[str, list[str]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if "runs on p2p" in str(record.msg) and isinstance(record.args, tuple) and len(record.args) == 2:
            op, why = record.args
            self.why.setdefault(str(op), []).append(str(why))


_SYMM_LOG = _SymmFallbackLog()
_symm_logger = logging.getLogger("overlap_backend.symm")
_symm_logger.addHandler(_SYMM_LOG)
if _symm_logger.getEffectiveLevel() > logging.INFO:
    _symm_logger.setLevel(logging.INFO)


def _symm_paths():
    """The symm lowering's per-process call counter ({"ag_mm:symm": n, "ag_mm:p2p": n, ...}), if it has one."""
    return getattr(getattr(getattr(overlap_backend.runtime, "symm", None), "lowering_helpers", None), "PATHS", None)


@dataclass
class Check:
    status: str  # PASS | FAIL | ERROR (ours raised on some rank) | n/a (not registered / not supported / p2p fallback)
    err: float  # max over ranks of the relative error (inf: raised; nan: not run)
    reason: str | None = None  # why, for every status but PASS/FAIL
    path: str | None = None  # symm only: "symm", "one-shot" (mm_ar), "cuBLAS" (mm_rs / mm_ar), or None when not known


def check_ours(suite, shape, ws, dtype, device, gn, lowering) -> Check:
    """Run one lowering of ours once on fresh random inputs against NCCL + a float32 matmul.

    Every rank returns the same status, so every rank makes the same timing decision. The symm
    lowering runs what its kernels do not cover on p2p, silently: when its call counter shows that
    it did here, the symm column is n/a (its time would be p2p's, already in the p2p column).
    """
    have = overlap_backend.runtime.available(suite)
    if lowering not in have:
        return Check("n/a", math.nan, f"lowering {lowering!r} is not registered for overlap::{suite} "
                                      f"(overlap_backend.runtime.available({suite!r}) = {have})")
    paths = _symm_paths() if lowering == "symm" else None
    if lowering == "symm" and paths is None and device.type != "cuda":
        return Check("n/a", math.nan, "the symm lowering needs CUDA")  # (its fallback is not observable here)
    torch.manual_seed(4321 + dist.get_rank())
    before = dict(paths) if paths is not None else None
    seen_before = len(_SYMM_LOG.why.get(suite, []))
    mine: tuple[str, str] | None = None
    try:
        err = CHECKS[suite](shape.M, shape.K, shape.N, ws, dtype, device, gn, lowering)
    except _UNSUPPORTED as e:
        err, mine = math.inf, ("n/a", f"raised at setup: {_short(e)}")
    except Exception as e:  # noqa: BLE001
        err, mine = math.inf, ("ERROR", f"raised: {_short(e)}")
    path = None
    if before is not None:
        new = {k for k, v in paths.items() if v > before.get(k, 0)}
        path = ("p2p" if f"{suite}:p2p" in new else "one-shot" if f"{suite}:oneshot" in new
                else "cuBLAS" if f"{suite}:symm:cublas" in new else "symm" if new else None)
    err = common.allreduce_max([err], device)[0]
    got: list = [None] * dist.get_world_size()
    dist.all_gather_object(got, (mine, path))
    raised = [(r, m) for r, (m, _) in enumerate(got) if m is not None]
    if raised:
        status = "ERROR" if any(m[0] == "ERROR" for _, m in raised) else "n/a"
        rank, (_, msg) = raised[0]
        return Check(status, math.inf, f"rank {rank} {msg}")
    status = "PASS" if err <= TOL[dtype] else "FAIL"
    if any(pth == "p2p" for _, pth in got):
        whys = _SYMM_LOG.why.get(suite, [])
        # The lowering logs each (op, reason) once per process: a reason seen for an earlier row is not repeated.
        why = ("; ".join(dict.fromkeys(whys[seen_before:])) or
               (f"one of: {'; '.join(dict.fromkeys(whys))}" if whys else "see the overlap_backend.symm log"))
        return Check("n/a", err, f"the symm lowering ran this op on its p2p fallback ({why}); "
                                 f"its check through p2p: {status} ({err:.1e})", "p2p")
    return Check(status, err, None, path)


def _time_ours(r: Runner, suite: str, t: dict, gn: str, checks: dict[str, Check]) -> None:
    for lowering, c in checks.items():
        key = ours_key(lowering)
        if c.status in ("n/a", "ERROR"):
            # An op that raised in its check is not called again (a rank stuck in it would hang the others).
            r.na(key, c.reason if c.status == "n/a" else f"not timed, the check {c.reason}")
        else:
            r.run(key, ours_fn(suite, lowering, t, gn))


# Ours on p2p runs NCCL P2P on side streams with host-side events: not captured by this benchmark.
GRAPH_SKIP = {ours_key("p2p"): "not captured (ours p2p: eager side streams)"}


def time_graphs(r: Runner, keys: list[str]) -> tuple[dict[str, float | None], dict[str, str]]:
    """Replay times (ms) of ``r``'s timed variants captured in CUDA graphs, and why any is missing.
    Collective: every rank captures the same keys in the same order, and a graph is replayed only
    if every rank captured it (a rank replaying alone would wait for its peers forever)."""
    times: dict[str, float | None] = {}
    notes: dict[str, str] = {}
    for key in keys:
        if key in GRAPH_SKIP:
            times[key], notes[key] = None, GRAPH_SKIP[key]
            continue
        have = common.allreduce_max([0.0 if key in r.fns else 1.0], r.timing.device)[0] == 0.0
        if not have:
            times[key] = None
            continue
        g, why = None, None
        try:
            g = common.capture_graph(r.fns[key])
        except Exception as e:  # noqa: BLE001 - a variant this torch cannot capture shows as n/a
            why = f"capture failed: {_short(e, 150)}"
        everyone = common.allreduce_max([0.0 if g is not None else 1.0], r.timing.device)[0] == 0.0
        if everyone:
            times[key], _ = r.timing.bench(g.replay)
        else:
            times[key], notes[key] = None, why or "capture failed on another rank"
        del g
        torch.cuda.synchronize()
    return times, notes


# ------------------------------------------------------------------------------ the suites
def bench_ag_mm(r: Runner, s: Shape, ws: int, dtype, device, gn, checks) -> None:
    shard = _randn((s.M // ws, s.K), dtype, device)
    b = _randn((s.K, s.N), dtype, device, s.K**-0.5)
    full = torch.empty((s.M, s.K), dtype=dtype, device=device)
    dist.all_gather_into_tensor(full, shard)
    r.run("mm", lambda: torch.mm(full, b))
    r.run("comm", lambda: dist.all_gather_into_tensor(full, shard))

    def seq():
        dist.all_gather_into_tensor(full, shard)
        return torch.mm(full, b)

    r.run("seq", seq)
    if device.type == "cuda":
        _enable_symm_mem(gn)
        # return_A=True: with False torch may take its multimem (NVLink multicast) path.
        r.run("torch", lambda: torch.ops.symm_mem.fused_all_gather_matmul(shard, [b], 0, gn, return_A=True))
    else:
        r.na("torch", "async-TP ops need CUDA")
    _time_ours(r, "ag_mm", {"shard": shard, "b": b}, gn, checks)


def bench_mm_rs(r: Runner, s: Shape, ws: int, dtype, device, gn, checks) -> None:
    a = _randn((s.M, s.K // ws), dtype, device)
    b = _randn((s.K // ws, s.N), dtype, device, (s.K // ws) ** -0.5)
    c = torch.mm(a, b)
    out = torch.empty((s.M // ws, s.N), dtype=dtype, device=device)
    r.run("mm", lambda: torch.mm(a, b))
    r.run("comm", lambda: dist.reduce_scatter_tensor(out, c))

    def seq():
        dist.reduce_scatter_tensor(out, torch.mm(a, b))
        return out

    r.run("seq", seq)
    if device.type == "cuda":
        _enable_symm_mem(gn)
        r.run("torch", lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", 0, gn))
    else:
        r.na("torch", "async-TP ops need CUDA")
    _time_ours(r, "mm_rs", {"a": a, "b": b, "M": s.M, "N": s.N}, gn, checks)


_SYMM_BUFFERS: list[torch.Tensor] = []  # kept alive to the end: freeing symmetric memory is not free


def bench_mm_ar(r: Runner, s: Shape, ws: int, dtype, device, gn, checks) -> None:
    a = _randn((s.M, s.K), dtype, device)
    b = _randn((s.K, s.N), dtype, device, s.K**-0.5)
    zeros = torch.zeros((s.M, s.N), dtype=dtype, device=device)  # all-reduced in place: stays zero
    r.run("mm", lambda: torch.mm(a, b))
    r.run("comm", lambda: dist.all_reduce(zeros))

    def seq():
        c = torch.mm(a, b)
        dist.all_reduce(c)
        return c

    r.run("seq", seq)
    symm_keys = ("symm1", "symm2", "mm_symm1", "mm_symm2")
    if device.type != "cuda":
        for k in symm_keys:
            r.na(k, "symmetric memory needs CUDA")
    else:
        buf = None
        try:
            from torch.distributed import _symmetric_memory as symm_mem

            _enable_symm_mem(gn)
            buf = symm_mem.empty((s.M, s.N), dtype=dtype, device=device)
            symm_mem.rendezvous(buf, gn)
            buf.zero_()
            _SYMM_BUFFERS.append(buf)
        except Exception as e:  # noqa: BLE001
            for k in symm_keys:
                r.na(k, f"symm_mem.empty/rendezvous: {type(e).__name__}: {str(e).strip()[:150]}")
        if buf is not None:
            ops = torch.ops.symm_mem
            # Alone first, on a zero buffer (the in-place two-shot keeps it zero), then after the mm.
            r.run("symm1", lambda: ops.one_shot_all_reduce(buf, "sum", gn))
            r.run("symm2", lambda: ops.two_shot_all_reduce_(buf, "sum", gn))

            def mm_symm1():
                torch.mm(a, b, out=buf)
                return ops.one_shot_all_reduce(buf, "sum", gn)

            def mm_symm2():
                torch.mm(a, b, out=buf)
                return ops.two_shot_all_reduce_(buf, "sum", gn)

            r.run("mm_symm1", mm_symm1)
            r.run("mm_symm2", mm_symm2)
    _time_ours(r, "mm_ar", {"a": a, "b": b}, gn, checks)


BENCH = {"ag_mm": bench_ag_mm, "mm_rs": bench_mm_rs, "mm_ar": bench_mm_ar}

# Time columns of each suite's table before ours: (key, header). Ours and the derived ones follow.
BASE_COLUMNS = {
    "ag_mm": [("mm", "cuBLAS mm"), ("comm", "NCCL all-gather"), ("seq", "NCCL then mm"),
              ("torch", "torch async-TP fused")],
    "mm_rs": [("mm", "cuBLAS mm"), ("comm", "NCCL reduce-scatter"), ("seq", "mm then NCCL"),
              ("torch", "torch async-TP fused")],
    "mm_ar": [("mm", "cuBLAS mm"), ("comm", "NCCL all-reduce"), ("seq", "mm then NCCL AR"),
              ("symm1", "symm 1-shot AR"), ("symm2", "symm 2-shot AR"),
              ("mm_symm1", "mm then symm 1-shot"), ("mm_symm2", "mm then symm 2-shot")],
}
# torch's best comparable op, the reference of the "<torch> / symm" ratio (the smallest time of these).
TORCH_REF = {"ag_mm": ("torch",), "mm_rs": ("torch",), "mm_ar": ("mm_symm1", "mm_symm2")}
TORCH_REF_HEADER = {"ag_mm": "async-TP / symm", "mm_rs": "async-TP / symm", "mm_ar": "torch symm AR / symm"}
DESCRIPTIONS = {
    "ag_mm": "all-gather + GEMM: A shard [M/ws, K] gathered to [M, K], times B [K, N]",
    "mm_rs": "GEMM + reduce-scatter: A [M, K/ws] @ B [K/ws, N] -> [M, N], reduce-scattered over M",
    "mm_ar": "GEMM + all-reduce: A [M, K] @ B [K, N] per rank, all-reduced",
}


def columns(suite: str, lowerings) -> list[tuple[str, str]]:
    """Time columns of a suite's table: (key in ``times_ms``, header)."""
    return BASE_COLUMNS[suite] + [(ours_key(lo), f"ours {lo}") for lo in lowerings]


def derive(row: dict, suite: str, lowerings) -> None:
    """Derived numbers of a row; each is None where a time is missing or the check did not PASS."""
    t = row["times_ms"]
    mm, comm, seq = t.get("mm"), t.get("comm"), t.get("seq")
    ideal = max(mm, comm) if mm is not None and comm is not None else None
    row["max_mm_comm_ms"] = ideal
    row["speedup_vs_seq"], row["gap_closed"] = {}, {}
    for lo in lowerings:
        key = ours_key(lo)
        ours = t.get(key)
        ok = row["check"][key] == "PASS" and ours is not None and ours > 0 and seq is not None
        row["speedup_vs_seq"][key] = seq / ours if ok else None
        row["gap_closed"][key] = (seq - ours) / (seq - ideal) if ok and ideal is not None and seq > ideal else None
    if "symm" in lowerings:
        symm = t.get("ours_symm")
        ok = row["check"]["ours_symm"] == "PASS" and symm is not None and symm > 0
        refs = [t[k] for k in TORCH_REF[suite] if t.get(k) is not None]
        torch_ref = min(refs) if refs else None
        row["symm_over_max"] = symm / ideal if ok and ideal else None
        row["torch_over_symm"] = torch_ref / symm if ok and torch_ref is not None else None
        if row["symm_over_max"] is None or row["torch_over_symm"] is None:
            row["meets_bar"] = None
        else:
            row["meets_bar"] = row["symm_over_max"] <= BAR_MAX_RATIO and row["torch_over_symm"] >= BAR_TORCH_RATIO
        g = row.get("graph_ms")
        if g is not None:
            gmm, gcomm, gsymm = g.get("mm"), g.get("comm"), g.get("ours_symm")
            gideal = max(gmm, gcomm) if gmm is not None and gcomm is not None else None
            grefs = [g[k] for k in TORCH_REF[suite] if g.get(k) is not None]
            gok = row["check"]["ours_symm"] == "PASS" and gsymm is not None and gsymm > 0
            row["graph_max_mm_comm_ms"] = gideal
            row["graph_symm_over_max"] = gsymm / gideal if gok and gideal else None
            row["graph_torch_over_symm"] = min(grefs) / gsymm if gok and grefs else None
            if row["graph_symm_over_max"] is None or row["graph_torch_over_symm"] is None:
                row["graph_meets_bar"] = None
            else:
                row["graph_meets_bar"] = (row["graph_symm_over_max"] <= BAR_MAX_RATIO
                                          and row["graph_torch_over_symm"] >= BAR_TORCH_RATIO)


def _fmt_ratio(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}×"


def render(suite: str, ws: int, dtype, info: dict, rows: list[dict], lowerings) -> str:
    cols = columns(suite, lowerings)
    headers = ["M", "K", "N", "local A", *[h for _, h in cols], "max(mm, comm)"]
    headers += [f"speedup {lo}" for lo in lowerings] + [f"gap closed {lo}" for lo in lowerings]
    if "symm" in lowerings:
        headers += ["symm / max", TORCH_REF_HEADER[suite], "bar"]
    headers += [f"check {lo} (rel err)" for lo in lowerings] + ["shape from"]
    body = []
    notes: dict[str, str] = {}
    for row in rows:
        cells = [row["M"], row["K"], row["N"], "×".join(map(str, row["local_a"]))]
        for key, header in cols:
            v = row["times_ms"].get(key)
            if v is None and key in row["notes"]:
                cells.append("n/a")
                notes.setdefault(header, row["notes"][key])
            else:
                cells.append(common.fmt_ms(v))
        cells.append(common.fmt_ms(row["max_mm_comm_ms"]))
        cells += [_fmt_ratio(row["speedup_vs_seq"][ours_key(lo)]) for lo in lowerings]
        for lo in lowerings:
            gap = row["gap_closed"][ours_key(lo)]
            cells.append("—" if gap is None else f"{gap * 100:.0f}%")
        if "symm" in lowerings:
            cells += [_fmt_ratio(row["symm_over_max"]), _fmt_ratio(row["torch_over_symm"])]
            cells.append({True: "yes", False: "no", None: "—"}[row["meets_bar"]])
        for lo in lowerings:
            key = ours_key(lo)
            status, err = row["check"][key], row["rel_err"][key]
            cell = status if status in ("n/a", "ERROR") else f"{status} ({err:.1e})"
            if lo == "symm" and row.get("symm_path") in ("one-shot", "cuBLAS"):
                cell += f" {row['symm_path']}"
            cells.append(cell)
            if status == "FAIL":  # (ERROR and n/a are explained under the time column)
                notes.setdefault(f"check {lo}", row["notes"].get(key, ""))
        cells.append(row["origin"])
        body.append(cells)
    legend = ("speedup = seq / ours (seq: the plain sequence, the third time column); "
              "gap closed = (seq − ours) / (seq − max(mm, comm))")
    if "symm" in lowerings:
        ref = "torch's async-TP fused op" if suite != "mm_ar" else "the faster of torch's mm then symm 1-/2-shot AR"
        legend += (f"; symm / max = ours symm / max(mm, comm); {TORCH_REF_HEADER[suite]} = {ref} / ours symm; "
                   f"bar = the target met (symm / max ≤ {BAR_MAX_RATIO:.2f} and "
                   f"{TORCH_REF_HEADER[suite]} ≥ {BAR_TORCH_RATIO:.2f})")
    legend += "; ratios are — where the check of ours did not PASS or a time is n/a."
    parts = [
        f"# {suite}, world size {ws}, {str(dtype).removeprefix('torch.')}",
        "",
        f"{DESCRIPTIONS[suite]}. Times in ms: per-rank median of repetitions timed with "
        f"{'CUDA events' if info['device'] == 'cuda' else 'the wall clock (CPU smoke test)'} after "
        f"warm-up, maximum over ranks; each variant timed once, then in {info.get('rounds', 0)} more rounds "
        f"interleaved with the other variants, its time the median of those. {legend}",
        "",
        common.info_markdown(info),
        "",
        common.markdown_table(headers, body),
    ]
    if notes:
        parts += ["", *[f"- {h}: {n}" for h, n in notes.items()]]
    if any(row.get("graph_ms") is not None for row in rows):
        parts += ["", *_render_graphs(suite, rows, lowerings)]
    return "\n".join(parts) + "\n"


def _render_graphs(suite: str, rows: list[dict], lowerings) -> list[str]:
    """The table of CUDA-graph replay times (``--graphs``) and the bar's ratios on them."""
    cols = columns(suite, lowerings)
    headers = ["M", "K", "N", *[h for _, h in cols], "max(mm, comm)"]
    if "symm" in lowerings:
        headers += ["symm / max", TORCH_REF_HEADER[suite], "bar"]
    body, notes = [], {}
    for row in rows:
        g = row.get("graph_ms") or {}
        cells = [row["M"], row["K"], row["N"]]
        for key, header in cols:
            if g.get(key) is None and key in row.get("graph_notes", {}):
                cells.append("n/a")
                notes.setdefault(header, row["graph_notes"][key])
            else:
                cells.append(common.fmt_ms(g.get(key)))
        cells.append(common.fmt_ms(row.get("graph_max_mm_comm_ms")))
        if "symm" in lowerings:
            cells += [_fmt_ratio(row.get("graph_symm_over_max")), _fmt_ratio(row.get("graph_torch_over_symm")),
                      {True: "yes", False: "no", None: "—"}[row.get("graph_meets_bar")]]
        body.append(cells)
    out = ["## CUDA-graph replays (`--graphs`)", "",
           "Each variant captured once in a CUDA graph after its eager timing, replays timed the same way: "
           "GPU time without host time, as under `torch.compile(mode=\"reduce-overhead\")`. Ratios as above, "
           "on these times.", "", common.markdown_table(headers, body)]
    if notes:
        out += ["", *[f"- {h}: {n}" for h, n in notes.items()]]
    return out


# ------------------------------------------------------------------------------ traces
TRACE_NAMES = {"seq": "seq", "torch": "async_tp", "mm_symm1": "mm_symm1", "mm_symm2": "mm_symm2",
               **{ours_key(lo): ours_key(lo) for lo in LOWERINGS}}


def trace_variants(suite: str, r: Runner, lowerings) -> list[tuple[str, object]]:
    """(file name part, callable) of the variants to trace: seq, torch's best fused op, ours."""
    ok = {k: r.times.get(k) is not None and k in r.fns for k in ("seq", *TORCH_REF[suite], *map(ours_key, lowerings))}
    # Every rank must trace the same variants (each call is a collective).
    flags = common.allreduce_max([0.0 if v else 1.0 for v in ok.values()], r.timing.device)
    ok = {k: f == 0.0 for k, f in zip(ok, flags)}
    torch_keys = [k for k in TORCH_REF[suite] if ok[k]]
    torch_best = min(torch_keys, key=lambda k: r.times[k]) if torch_keys else None
    keys = ["seq", torch_best, *map(ours_key, lowerings)]
    return [(TRACE_NAMES[k], r.fns[k]) for k in keys if k is not None and ok[k]]


# ------------------------------------------------------------------------------ one suite
def run_suite(suite: str, args, ws: int, dtype, device, timing: common.Timing, info: dict, out_dir: Path,
              trace_jobs: list) -> bool:
    rank = dist.get_rank()
    gn = common.group_name()
    lowerings = args.lowerings
    rows: list[dict] = []
    all_ok = True
    for shape in select_shapes(suite, ws, args.quick, device.type == "cpu"):
        torch.manual_seed(1234 + rank)
        checks = {lo: check_ours(suite, shape, ws, dtype, device, gn, lo) for lo in lowerings}
        all_ok &= all(c.status in ("PASS", "n/a") for c in checks.values())
        r = Runner(timing, args.verbose)
        torch.manual_seed(1234 + rank)
        BENCH[suite](r, shape, ws, dtype, device, gn, checks)
        r.interleave(args.rounds)
        local_a = local_shapes(suite, shape, ws)["A"]
        row = {
            "M": shape.M, "K": shape.K, "N": shape.N, "origin": shape.origin, "local_a": list(local_a),
            "times_ms": r.times, "reps": r.reps, "round_ms": r.round_ms, "notes": r.notes,
            "check": {ours_key(lo): c.status for lo, c in checks.items()},
            "rel_err": {ours_key(lo): None if c.status == "n/a" else c.err for lo, c in checks.items()},
            "symm_path": checks["symm"].path if "symm" in checks else None,
        }
        if args.graphs and device.type == "cuda":
            row["graph_ms"], row["graph_notes"] = time_graphs(r, [k for k, _ in columns(suite, lowerings)])
        for lo, c in checks.items():
            if c.status == "FAIL":
                row["notes"][ours_key(lo)] = (f"FAIL: relative error {c.err:.3e} vs NCCL + fp32 mm "
                                              f"(tolerance {TOL[dtype]:g}); timed anyway")
            elif c.status == "ERROR":
                row["notes"][ours_key(lo)] = f"ERROR: the check {c.reason}"
        derive(row, suite, lowerings)
        rows.append(row)
        if rank == 0:
            print(f"[{suite} ws={ws}] M={shape.M} K={shape.K} N={shape.N}: "
                  + ", ".join(f"{k}={common.fmt_ms(v)}" for k, v in r.times.items())
                  + ", checks: " + ", ".join(f"{lo}={c.status} ({c.err:.1e})" + (f" [{c.path}]" if c.path else "")
                                             for lo, c in checks.items()), flush=True)
            for k, n in r.notes.items():
                print(f"    {k}: {n}", flush=True)
            stem = out_dir / f"{suite}_ws{ws}"
            stem.with_suffix(".md").write_text(render(suite, ws, dtype, info, rows, lowerings))
            common.write_json(stem.with_suffix(".json"), {
                "suite": suite, "world_size": ws, "dtype": str(dtype), "description": DESCRIPTIONS[suite],
                "lowerings": list(lowerings), "columns": dict(columns(suite, lowerings)),
                "bar": {"symm_over_max_at_most": BAR_MAX_RATIO, "torch_over_symm_at_least": BAR_TORCH_RATIO,
                        "torch_reference": list(TORCH_REF[suite])},
                "machine": info, "rows": rows,
            })
        if args.trace and (args.trace_m is None or shape.M in args.trace_m):
            # Traced after ALL timing (end of main): the profiler must not touch the timed numbers.
            trace_jobs.append((f"{suite}_ws{ws}_M{shape.M}", trace_variants(suite, r, lowerings)))
        else:
            r.fns.clear()
        del r
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if rank == 0:
        md = out_dir / f"{suite}_ws{ws}.md"
        print(md.read_text() if rows else f"[{suite} ws={ws}] no shape divides evenly over {ws} ranks", flush=True)
    return all_ok


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Run under torchrun, one process per GPU. See bench/README.md.")
    p.add_argument("--suite", default=",".join(SUITES),
                   help=f"comma-separated suites out of {', '.join(SUITES)} (default: all)")
    p.add_argument("--lowerings", default=",".join(LOWERINGS),
                   help=f"comma-separated lowerings of ours to check and time, out of {', '.join(LOWERINGS)} "
                        "(default: all); a lowering not registered for an op shows as n/a")
    p.add_argument("--out-dir", default="bench/results", help="where rank 0 writes <suite>_ws<N>.md/.json")
    p.add_argument("--quick", action="store_true", help="smoke test: 2 shapes per suite, fewer repetitions")
    p.add_argument("--trace", metavar="DIR", default=None,
                   help="after all timing, write one torch.profiler (Chrome/Perfetto JSON) trace of one call per "
                        "variant (seq, torch's fused op, ours per lowering) and row to "
                        "DIR/<suite>_ws<N>_M<M>_<variant>_rank<R>.json, ranks 0 and 1 only")
    p.add_argument("--trace-m", metavar="M[,M...]", default=None,
                   help="with --trace: trace only the rows with these M (global M as in the table, e.g. 4096)")
    p.add_argument("--graphs", action="store_true",
                   help="also time every variant (but ours on p2p) captured in a CUDA graph: a second table")
    p.add_argument("--rounds", type=int, default=2,
                   help="after every variant of a shape was timed once, this many more rounds over them, interleaved "
                        "(a variant's time: the median of its timings; the GPUs' clocks drift under a sustained load)")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of baselines that are n/a")
    p.add_argument("--list-shapes", metavar="WS", type=int, default=None,
                   help="print the rows (global problem, per-rank operands) a run with WS processes takes, then "
                        "exit (no torchrun, no GPU)")
    # Hidden: exercise the code paths on the CPU with gloo, float32 and tiny shapes.
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help=argparse.SUPPRESS)
    common.add_set_argument(p)
    args = common.parse_args_with_sets(p, argv)
    if args.graphs and args.device != "cuda":
        p.error("--graphs needs CUDA")
    if args.rounds < 0:
        p.error(f"--rounds {args.rounds}: 0 or more")
    suites = _csv(args.suite)
    bad = [s for s in suites if s not in SUITES]
    if bad or not suites:
        p.error(f"--suite: unknown {bad or 'empty'}; allowed: {', '.join(SUITES)}")
    args.suites = suites
    lowerings = _csv(args.lowerings)
    bad = [lo for lo in lowerings if lo not in LOWERINGS]
    if bad or not lowerings:
        p.error(f"--lowerings: unknown {bad or 'empty'}; allowed: {', '.join(LOWERINGS)}")
    args.lowerings = [lo for lo in LOWERINGS if lo in lowerings]  # column order
    if args.trace_m is not None:
        try:
            args.trace_m = {int(m) for m in _csv(args.trace_m)}
        except ValueError:
            p.error(f"--trace-m {args.trace_m!r}: comma-separated integers expected")
        if args.trace is None:
            p.error("--trace-m needs --trace DIR")
    return args


def print_shapes(ws: int, args) -> None:
    rows = list_shapes(ws, args.suites, args.quick, args.device == "cpu")
    print(f"world size {ws}{' (--device cpu)' if args.device == 'cpu' else ''}{' (--quick)' if args.quick else ''}:")
    print(common.markdown_table(["suite", "M", "K", "N", "A per rank", "B per rank", "out per rank", "shape from"],
                                [[r["suite"], r["M"], r["K"], r["N"], *("×".join(map(str, r[k])) for k in ("A", "B", "out")),
                                  r["origin"]] for r in rows]))


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list_shapes is not None:
        print_shapes(args.list_shapes, args)
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_collective_gemm: CUDA is not available (use the device machine)", file=sys.stderr)
        return 2
    rank, ws, device = common.init_distributed(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.quick:
        timing = common.Timing(device, warmup_ms=5, rep_ms=10, min_reps=10, max_reps=20, min_warmup=2)
    else:
        timing = common.Timing(device)
    out_dir = Path(args.out_dir)
    trace_dir = Path(args.trace) if args.trace else None
    if rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        if trace_dir is not None:
            trace_dir.mkdir(parents=True, exist_ok=True)
    info = common.machine_info(device, ws)
    info["dtype"] = str(dtype)
    info["quick"] = args.quick
    info["rounds"] = args.rounds
    info["lowerings_registered"] = {s: list(overlap_backend.runtime.available(s)) for s in SUITES}
    ok = True
    trace_jobs: list = []
    try:
        for suite in args.suites:
            ok &= run_suite(suite, args, ws, dtype, device, timing, info, out_dir, trace_jobs)
        common.synchronize(device)
        dist.barrier()
        if trace_jobs:
            if trace_dir is not None and rank in common.TRACE_RANKS:
                trace_dir.mkdir(parents=True, exist_ok=True)
            n = 0
            for stem, variants in trace_jobs:
                n += len(common.write_traces(variants, trace_dir, device, stem, warmup=TRACE_WARMUP))
            if rank == 0:
                print(f"bench_collective_gemm: {n} trace(s) per traced rank written to {trace_dir} "
                      f"(ranks {', '.join(map(str, common.TRACE_RANKS))})", flush=True)
            trace_jobs.clear()
            common.synchronize(device)
            dist.barrier()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        print("bench_collective_gemm: all checks of ours PASS (or n/a)" if ok
              else "bench_collective_gemm: some check of ours FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    common.exit_now(main())
