"""GEMM + collective benchmark: cuBLAS, NCCL, torch async-TP / symmetric memory, and ours.

    torchrun --nproc-per-node=N bench/bench_collective_gemm.py --suite ag_mm,mm_rs,mm_ar --out-dir DIR

For each suite and shape (DESIGN.md's measured tables, plus a decode-size M=512 row for ag_mm and
mm_rs) it times, in bf16, with CUDA events (warm-up, >= 20 timed repetitions, median per rank, max
over ranks; a barrier before each measurement):

- ``mm``: cuBLAS ``torch.mm`` alone on the full local problem;
- ``comm``: the NCCL collective alone;
- ``seq``: the NCCL collective then the matmul (ag_mm), or the matmul then the collective;
- torch's own fused ops: async-TP ``symm_mem.fused_all_gather_matmul`` /
  ``fused_matmul_reduce_scatter``; for all-reduce the symmetric-memory one-shot / two-shot
  all-reduce on a ``symm_mem.empty`` buffer, alone and after the matmul (``n/a: reason`` when the
  installed torch cannot run them);
- ``ours``: ``torch.ops.overlap.<suite>(..., lowering="p2p")``, checked first against NCCL + a
  float32 matmul on fresh random inputs (relative error <= 1e-2 in bf16, no NaN: else FAIL);
- ``max(mm, comm)``: the time a perfect overlap would take; ``speedup`` = seq / ours.

Rank 0 writes ``DIR/<suite>_ws<N>.md`` (machine info + table) and ``DIR/<suite>_ws<N>.json``,
rewritten after every row so that an interrupted run keeps what it measured. See bench/README.md.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: overlap_backend, bench

from bench import common  # noqa: E402  (sets the NVLink-multicast-off environment first)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import overlap_backend  # noqa: E402,F401  registers torch.ops.overlap.*

# dist.reduce_scatter_tensor is NCCL's own name for the collective; its deprecation notice is noise here.
warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")

SUITES = ("ag_mm", "mm_rs", "mm_ar")
TOL = {torch.bfloat16: 1e-2, torch.float16: 1e-2, torch.float32: 1e-4}


@dataclass(frozen=True)
class Shape:
    M: int
    K: int
    N: int
    origin: str  # where the row comes from: "DESIGN ws=4", "decode", "adapted from ws=4", ...


# Global problem sizes from DESIGN.md ("Measured on 4×H200"), keyed by the world size measured there.
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
    # Sizes that ws does not divide are left out (only possible for ws not in {2, 4}).
    split = {"ag_mm": ("M",), "mm_rs": ("M", "K"), "mm_ar": ()}[suite]
    rows = [s for s in rows if all(getattr(s, d) % ws == 0 for d in split)]
    return rows[:2] if quick else rows


# ------------------------------------------------------------------------------ one variant
class Runner:
    """Times variants of one shape; a variant that raises is recorded as ``n/a: reason``."""

    def __init__(self, timing: common.Timing, verbose: bool):
        self.timing = timing
        self.verbose = verbose
        self.times: dict[str, float | None] = {}
        self.notes: dict[str, str] = {}
        self.reps: dict[str, int] = {}

    def run(self, key: str, fn) -> None:
        try:
            ms, reps = self.timing.bench(fn)
            self.times[key], self.reps[key] = ms, reps
        except Exception as e:  # noqa: BLE001 - a baseline this torch cannot run is reported, not fatal
            self.na(key, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:200])
            if self.verbose:
                traceback.print_exc()

    def na(self, key: str, reason: str) -> None:
        self.times[key] = None
        self.notes[key] = f"n/a: {reason}"


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


# ------------------------------------------------------------------------------ checks of ours
def check_ag_mm(M, K, N, ws, dtype, device, gn) -> float:
    shard = _randn((M // ws, K), dtype, device)
    b = _randn((K, N), dtype, device, K**-0.5)
    _, outs = torch.ops.overlap.ag_mm(shard, [b], [None], 0, gn, "p2p", False)
    full = torch.empty((M, K), dtype=dtype, device=device)
    dist.all_gather_into_tensor(full, shard)
    return common.rel_err(outs[0], full.float() @ b.float())


def check_mm_rs(M, K, N, ws, dtype, device, gn) -> float:
    a = _randn((M, K // ws), dtype, device)
    b = _randn((K // ws, N), dtype, device, (K // ws) ** -0.5)
    out = torch.ops.overlap.mm_rs(a, b, None, [M, N], 0, "sum", gn, "p2p")
    ref = torch.empty((M // ws, N), dtype=torch.float32, device=device)
    dist.reduce_scatter_tensor(ref, a.float() @ b.float())
    return common.rel_err(out, ref)


def check_mm_ar(M, K, N, ws, dtype, device, gn) -> float:
    a = _randn((M, K), dtype, device)
    b = _randn((K, N), dtype, device, K**-0.5)
    out = torch.ops.overlap.mm_ar(a, b, None, "sum", gn, "p2p")
    ref = a.float() @ b.float()
    dist.all_reduce(ref)
    return common.rel_err(out, ref)


CHECKS = {"ag_mm": check_ag_mm, "mm_rs": check_mm_rs, "mm_ar": check_mm_ar}


def check_ours(suite, shape, ws, dtype, device, gn) -> tuple[str, float]:
    """('PASS'|'FAIL'|'ERROR: ...', max over ranks of the relative error)."""
    torch.manual_seed(4321 + dist.get_rank())
    try:
        err = CHECKS[suite](shape.M, shape.K, shape.N, ws, dtype, device, gn)
        msg = None
    except Exception as e:  # noqa: BLE001
        err, msg = math.inf, f"ERROR: {type(e).__name__}: {str(e).strip()[:160]}"
    err = common.allreduce_max([err], device)[0]
    if msg is not None:
        return msg, err
    return ("PASS" if err <= TOL[dtype] else "FAIL"), err


# ------------------------------------------------------------------------------ the suites
def bench_ag_mm(r: Runner, s: Shape, ws: int, dtype, device, gn) -> None:
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
    r.run("ours", lambda: torch.ops.overlap.ag_mm(shard, [b], [None], 0, gn, "p2p", False))


def bench_mm_rs(r: Runner, s: Shape, ws: int, dtype, device, gn) -> None:
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
    r.run("ours", lambda: torch.ops.overlap.mm_rs(a, b, None, [s.M, s.N], 0, "sum", gn, "p2p"))


_SYMM_BUFFERS: list[torch.Tensor] = []  # kept alive to the end: freeing symmetric memory is not free


def bench_mm_ar(r: Runner, s: Shape, ws: int, dtype, device, gn) -> None:
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
    r.run("ours", lambda: torch.ops.overlap.mm_ar(a, b, None, "sum", gn, "p2p"))


BENCH = {"ag_mm": bench_ag_mm, "mm_rs": bench_mm_rs, "mm_ar": bench_mm_ar}

# Columns of each suite's table: (key, header). 'max' and 'speedup' are derived.
COLUMNS = {
    "ag_mm": [("mm", "cuBLAS mm"), ("comm", "NCCL all-gather"), ("seq", "NCCL then mm"),
              ("torch", "torch async-TP fused"), ("ours", "ours (p2p)")],
    "mm_rs": [("mm", "cuBLAS mm"), ("comm", "NCCL reduce-scatter"), ("seq", "mm then NCCL"),
              ("torch", "torch async-TP fused"), ("ours", "ours (p2p)")],
    "mm_ar": [("mm", "cuBLAS mm"), ("comm", "NCCL all-reduce"), ("seq", "mm then NCCL AR"),
              ("symm1", "symm 1-shot AR"), ("symm2", "symm 2-shot AR"),
              ("mm_symm1", "mm then symm 1-shot"), ("mm_symm2", "mm then symm 2-shot"), ("ours", "ours (p2p)")],
}
DESCRIPTIONS = {
    "ag_mm": "all-gather + GEMM: A shard [M/ws, K] gathered to [M, K], times B [K, N]",
    "mm_rs": "GEMM + reduce-scatter: A [M, K/ws] @ B [K/ws, N] -> [M, N], reduce-scattered over M",
    "mm_ar": "GEMM + all-reduce: A [M, K] @ B [K, N] per rank, all-reduced",
}


def derive(row: dict) -> None:
    t = row["times_ms"]
    mm, comm, seq, ours = t.get("mm"), t.get("comm"), t.get("seq"), t.get("ours")
    row["max_mm_comm_ms"] = max(mm, comm) if mm is not None and comm is not None else None
    ok = row["check"] == "PASS" and ours is not None and seq is not None
    row["speedup_vs_seq"] = seq / ours if ok and ours > 0 else None
    ideal = row["max_mm_comm_ms"]
    row["gap_closed"] = (seq - ours) / (seq - ideal) if ok and ideal is not None and seq > ideal else None


def render(suite: str, ws: int, dtype, info: dict, rows: list[dict]) -> str:
    cols = COLUMNS[suite]
    headers = ["M", "K", "N", "local A", *[h for _, h in cols], "max(mm, comm)", "speedup vs seq", "gap closed",
               "check (rel err)", "shape from"]
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
        sp, gap = row["speedup_vs_seq"], row["gap_closed"]
        cells.append("—" if sp is None else f"{sp:.2f}×")
        cells.append("—" if gap is None else f"{gap * 100:.0f}%")
        cells.append(f"{row['check']} ({row['rel_err']:.1e})")
        cells.append(row["origin"])
        body.append(cells)
    parts = [
        f"# {suite}, world size {ws}, {str(dtype).removeprefix('torch.')}",
        "",
        f"{DESCRIPTIONS[suite]}. Times in ms: per-rank median of repetitions timed with "
        f"{'CUDA events' if info['device'] == 'cuda' else 'the wall clock (CPU smoke test)'} after "
        "warm-up, maximum over ranks. speedup = seq / ours (seq: the column before the fused ones); "
        "gap closed = (seq − ours) / (seq − max(mm, comm)).",
        "",
        common.info_markdown(info),
        "",
        common.markdown_table(headers, body),
    ]
    if notes:
        parts += ["", *[f"- {h}: {n}" for h, n in notes.items()]]
    return "\n".join(parts) + "\n"


def run_suite(suite: str, args, ws: int, dtype, device, timing: common.Timing, info: dict, out_dir: Path) -> bool:
    rank = dist.get_rank()
    gn = common.group_name()
    rows: list[dict] = []
    all_ok = True
    for shape in select_shapes(suite, ws, args.quick, device.type == "cpu"):
        torch.manual_seed(1234 + rank)
        status, err = check_ours(suite, shape, ws, dtype, device, gn)
        all_ok &= status == "PASS"
        r = Runner(timing, args.verbose)
        BENCH[suite](r, shape, ws, dtype, device, gn)
        local_a = {"ag_mm": (shape.M // ws, shape.K), "mm_rs": (shape.M, shape.K // ws), "mm_ar": (shape.M, shape.K)}[suite]
        row = {
            "M": shape.M, "K": shape.K, "N": shape.N, "origin": shape.origin, "local_a": list(local_a),
            "times_ms": r.times, "reps": r.reps, "notes": r.notes, "check": status, "rel_err": err,
        }
        if status != "PASS":
            row["notes"]["ours"] = f"{status}: relative error {err:.3e} vs NCCL + fp32 mm (tolerance {TOL[dtype]:g})"
        derive(row)
        rows.append(row)
        if rank == 0:
            print(f"[{suite} ws={ws}] M={shape.M} K={shape.K} N={shape.N}: "
                  + ", ".join(f"{k}={common.fmt_ms(v)}" for k, v in r.times.items())
                  + f", check={status} ({err:.1e})", flush=True)
            for k, n in r.notes.items():
                print(f"    {k}: {n}", flush=True)
            stem = out_dir / f"{suite}_ws{ws}"
            stem.with_suffix(".md").write_text(render(suite, ws, dtype, info, rows))
            common.write_json(stem.with_suffix(".json"), {
                "suite": suite, "world_size": ws, "dtype": str(dtype), "description": DESCRIPTIONS[suite],
                "columns": dict(COLUMNS[suite]), "machine": info, "rows": rows,
            })
        del r
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if rank == 0:
        md = out_dir / f"{suite}_ws{ws}.md"
        print(md.read_text() if rows else f"[{suite} ws={ws}] no shape divides evenly over {ws} ranks", flush=True)
    return all_ok


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Run under torchrun, one process per GPU. See bench/README.md.")
    p.add_argument("--suite", default=",".join(SUITES),
                   help=f"comma-separated suites out of {', '.join(SUITES)} (default: all)")
    p.add_argument("--out-dir", default="bench/results", help="where rank 0 writes <suite>_ws<N>.md/.json")
    p.add_argument("--quick", action="store_true", help="smoke test: 2 shapes per suite, fewer repetitions")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of baselines that are n/a")
    # Hidden: exercise the code paths on the CPU with gloo, float32 and tiny shapes.
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    suites = [s.strip() for s in args.suite.split(",") if s.strip()]
    bad = [s for s in suites if s not in SUITES]
    if bad or not suites:
        p.error(f"--suite: unknown {bad or 'empty'}; allowed: {', '.join(SUITES)}")
    args.suites = suites
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
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
    if rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
    info = common.machine_info(device, ws)
    info["dtype"] = str(dtype)
    info["quick"] = args.quick
    ok = True
    try:
        for suite in args.suites:
            ok &= run_suite(suite, args, ws, dtype, device, timing, info, out_dir)
        common.synchronize(device)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        print("bench_collective_gemm: all checks of ours PASS" if ok else "bench_collective_gemm: some check of ours FAILED",
              flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    code = main()
    # Results are written and the process group is gone: skip interpreter teardown, where freeing
    # symmetric-memory buffers and CUDA state could hang a run that has nothing left to do.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
