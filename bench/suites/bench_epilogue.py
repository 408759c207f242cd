"""Fused epilogues vs the same ops followed by Inductor's own pointwise kernels.

    torchrun --nproc-per-node=N bench/suites/bench_epilogue.py --out-dir DIR [--block tp|swiglu]
        [--mode inference|train] [--lowerings symm,p2p] [--steps 30] [--quick]
        [--batch B --seq S --hidden H --heads NH --ffn F --dtype bfloat16] [--trace TRACE_DIR]

The block is the demo's :class:`overlap_backend.models.TPBlock` (``--block tp``: Q/K/V biases,
GELU after fc1, two residual adds after the reduce-scatters) or :class:`TPSwiGLUMlp` (``--block
swiglu``: RMSNorm, ``silu(gate) * up`` of one all-gather, residual add), at the demo's GPU sizes
(``overlap_backend.examples.demo.GPU_DEFAULTS``). Variants, every one compiled with Inductor (CPU smoke runs
use ``--no-inductor``):

- ``inductor``: plain Inductor (its own collectives and fused pointwise kernels);
- ``<lowering>_unfused``: this backend with ``fuse_epilogues=False``: the overlap ops, then the
  pointwise nodes as Inductor compiles them (separate kernels);
- ``<lowering>_fused``: this backend with ``fuse_epilogues=True``: the pointwise nodes the passes
  captured run inside the ops (generated Triton epilogues).

``--mode inference`` (default) times the forward under ``torch.no_grad()``, where every epilogue
can be captured; ``--mode train`` times forward + backward (values saved for backward stay in the
graph, so fewer captures). Each variant is checked against eager first (relative error, max over
ranks: <= 1e-2 bf16, 1e-4 fp32, else FAIL), then timed: every variant is compiled first, then
timed in ``--rounds`` (default 5) interleaved rounds (variant A, B, C, A, B, C, ...), each the median
of >= ``--steps`` (default 30) steps, CUDA events, max over ranks (``bench/tools/common.py: Timing``); a
variant's time is the median of its rounds. Interleaving keeps slow drifts of the machine (host
speed, clocks) out of the comparison: one variant's time moved by 30% between two runs on 2xH200. Kernel launches per step come
from a torch.profiler trace of ``PROFILE_STEPS`` steps: GPU kernel events (memcpy/memset counted
apart) and the host's launch calls (``cudaLaunchKernel`` / ``cuLaunchKernel*``), divided by the
steps. The captured epilogue specs (from the backend's reports) are listed per variant. Rank 0
writes ``DIR/epilogue_<block>_<mode>_ws<N>.md`` and ``.json``. Exit status 1 if a check FAILs.
"""

from __future__ import annotations

import argparse
import math
import sys
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # repo root: overlap_backend, bench

from bench.tools import common  # noqa: E402  (sets the NVLink-multicast-off environment first)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import overlap_backend  # noqa: E402
from overlap_backend.examples.demo import GPU_DEFAULTS  # noqa: E402
from overlap_backend.models import TPBlock, TPSwiGLUMlp  # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TOL = {torch.bfloat16: 1e-2, torch.float16: 1e-2, torch.float32: 1e-4}
CPU_SIZES = common.cpu_block_sizes(2)  # up to 4 ranks; beyond, one head per rank (common.cpu_block_sizes)
PROFILE_STEPS = 5
_LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


def count_launches(events) -> dict[str, int]:
    """Kernels, copies and host launch calls among profiler ``events`` (FunctionEvent-like: ``name``,
    ``device_type``)."""
    from torch.autograd import DeviceType

    kernels = copies = launches = 0
    for e in events:
        name = e.name
        if e.device_type == DeviceType.CUDA:
            if name.startswith(("Memcpy", "Memset")):
                copies += 1
            else:
                kernels += 1
        elif name in _LAUNCH_CALLS:
            launches += 1
    return {"kernels": kernels, "copies": copies, "launch_calls": launches}


def kernel_times(events, steps: int, top: int = 12) -> list[tuple[str, float, float]]:
    """The ``top`` GPU kernels by total time: (name cut to 90 characters, ms per step, calls per
    step), from profiler ``events`` of ``steps`` steps (where a variant's time goes)."""
    from torch.autograd import DeviceType

    total: dict[str, list[float]] = {}
    for e in events:
        if e.device_type == DeviceType.CUDA:
            acc = total.setdefault(e.name[:90], [0.0, 0])
            acc[0] += e.time_range.elapsed_us() / 1e3
            acc[1] += 1
    ranked = sorted(total.items(), key=lambda kv: -kv[1][0])[:top]
    return [(name, ms / steps, calls / steps) for name, (ms, calls) in ranked]


def build_block(args, ws: int, device: torch.device):
    dtype = DTYPES[args.dtype]
    if args.block == "tp":
        block = TPBlock(args.hidden, args.heads, args.ffn, dtype=dtype, device=device, seed=0)
    else:
        block = TPSwiGLUMlp(args.hidden, args.ffn, dtype=dtype, device=device, seed=0)
    return block.requires_grad_(args.mode == "train")


def make_step(model, x, mode: str):
    if mode == "inference":
        def step():
            torch.compiler.cudagraph_mark_step_begin()  # (--cudagraphs) each step a new one; else nothing
            with torch.no_grad():
                return model(x)
        return step
    grad_out = torch.ones((), device=x.device)

    def train_step():
        torch.compiler.cudagraph_mark_step_begin()  # (--cudagraphs) each step a new one; else nothing
        x.grad = None
        for p in model.parameters():
            p.grad = None
        out = model(x)
        out.float().sum().mul(grad_out).backward()
        return out
    return train_step


def reference(model, x, mode: str) -> list[torch.Tensor]:
    if mode == "inference":
        with torch.no_grad():
            return [model(x).detach()]
    x = x.detach().clone().requires_grad_()
    out = model(x)
    out.float().sum().backward()
    return [out.detach(), x.grad] + [p.grad for p in model.parameters()]


def variants(args) -> list[tuple[str, dict | None]]:
    out = [("inductor", None)]
    for lowering in args.lowerings.split(","):
        out += [(f"{lowering}_unfused", dict(lowering=lowering, fuse_epilogues=False)),
                (f"{lowering}_fused", dict(lowering=lowering, fuse_epilogues=True))]
    return out


def run_variant(name, backend_kw, args, ws, device, x, ref) -> tuple[dict, object]:
    """Compile, check and profile one variant: (its row, its step function or None on an error).
    Timing is left to ``time_rounds`` (interleaved with the other variants)."""
    row = {"variant": name, "time_ms": None, "reps": None, "round_ms": [], "check": "—", "max_rel_err": None,
           "kernels_per_step": None, "copies_per_step": None, "launch_calls_per_step": None, "epilogues": [],
           "note": None}
    model = build_block(args, ws, device)
    if backend_kw is None:
        backend = "inductor" if args.inductor else "eager"
    else:
        backend = overlap_backend.make_backend(inductor=args.inductor, **{"cost_model": "off", **backend_kw})
    compiled = torch.compile(model, backend=backend, **({"mode": "reduce-overhead"} if args.cudagraphs else {}))
    xi = x.detach().clone().requires_grad_(args.mode == "train")
    try:
        got = reference(compiled, xi, args.mode)
    except Exception as e:  # noqa: BLE001
        if args.verbose:
            traceback.print_exc()
        row["check"], row["note"] = "ERROR", f"raised: {type(e).__name__}: {str(e)[:300]}"
        return row, None
    errs = [common.rel_err(g.float(), r.float()) for g, r in zip(got, ref)]
    err = common.allreduce_max([max(errs)], device)[0]
    tol = TOL[DTYPES[args.dtype]]
    row["max_rel_err"] = err
    row["check"] = "PASS" if math.isfinite(err) and err <= tol else "FAIL"
    if not isinstance(backend, str):
        row["epilogues"] = [e["spec"] for r in backend.reports for m in r.matches if m.epilogue
                            for e in m.epilogue if e["spec"]]
    step = make_step(compiled, xi, args.mode)
    step()  # warm (the profile below must not see compilation)
    # launches per step from a profiler trace of PROFILE_STEPS steps
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    common.synchronize(device)
    dist.barrier()
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(PROFILE_STEPS):
            step()
        common.synchronize(device)
    counts = count_launches(prof.events())
    row["top_kernels"] = kernel_times(prof.events(), PROFILE_STEPS)
    if device.type == "cuda":
        row["kernels_per_step"] = counts["kernels"] / PROFILE_STEPS
        row["copies_per_step"] = counts["copies"] / PROFILE_STEPS
        row["launch_calls_per_step"] = counts["launch_calls"] / PROFILE_STEPS
    if args.trace and dist.get_rank() in (0, 1):
        Path(args.trace).mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(Path(args.trace) / f"epilogue_{args.block}{_tag(args)}_{name}_rank{dist.get_rank()}.json"))
    return row, step


def time_rounds(rows, steps, rounds: int, timing) -> None:
    """``rounds`` interleaved rounds over the variants that have a step (``common.time_in_rounds``)."""
    common.time_in_rounds([(row, step) for row, step in zip(rows, steps) if step is not None], rounds, timing)


def fused_verdict(fused: dict, unfused: dict) -> dict | None:
    """The fused epilogues' target for one fused / unfused pair timed in the same interleaved rounds: fewer kernels per
    step, and faster, in the median and round by round (round i's unfused time over its fused time; the
    rounds ran side by side, so a drift of the machine shows in both)."""
    pairs = list(zip(unfused["round_ms"], fused["round_ms"]))
    if not pairs or not fused["time_ms"] or not unfused["time_ms"]:
        return None
    ratios = [u / f for u, f in pairs]
    kf, ku = fused.get("kernels_per_step"), unfused.get("kernels_per_step")
    fewer = kf is not None and ku is not None and kf < ku
    median = unfused["time_ms"] / fused["time_ms"]
    wins = sum(r > 1 for r in ratios)
    return {"speedup": median, "round_ratios": ratios, "faster_rounds": wins, "rounds": len(ratios),
            "fewer_kernels": fewer, "bar": fewer and median > 1 and wins == len(ratios)}


def render(rows, info, args, ws) -> str:
    def fmt(v, spec="{:.1f}"):
        return "n/a" if v is None else spec.format(v)

    base = {r["variant"]: r for r in rows}
    table = []
    for r in rows:
        unfused = base.get(r["variant"].replace("_fused", "_unfused")) if r["variant"].endswith("_fused") else None
        verdict = fused_verdict(r, unfused) if unfused else None
        speedup = "—" if verdict is None else (
            f"{verdict['speedup']:.3f}× (faster in {verdict['faster_rounds']}/{verdict['rounds']} rounds, "
            f"{min(verdict['round_ratios']):.3f}–{max(verdict['round_ratios']):.3f}×); bar "
            f"{'met' if verdict['bar'] else 'not met'}")
        table.append([r["variant"], common.fmt_ms(r["time_ms"]), " ".join(f"{v:.2f}" for v in r["round_ms"]) or "—",
                      r["reps"] or "—", speedup,
                      fmt(r["kernels_per_step"]), fmt(r["copies_per_step"]), fmt(r["launch_calls_per_step"]),
                      r["check"], fmt(r["max_rel_err"], "{:.2e}"), ", ".join(r["epilogues"]) or "—", r["note"] or ""])
    sizes = f"batch {args.batch}, seq {args.seq}, hidden {args.hidden}, heads {args.heads}, ffn {args.ffn}, {args.dtype}"
    return "\n\n".join([
        f"# Epilogue fusion: {args.block} block, {args.mode}, ws={ws}"
        + (", CUDA graphs (mode='reduce-overhead')" if args.cudagraphs else ""),
        common.info_markdown(info),
        f"Sizes: {sizes}. Time: median over {args.rounds} interleaved rounds of the median step (ms), max over "
        "ranks; rounds: each round's time. Kernels/copies/launch calls: per step, "
        f"from a profiler trace of {PROFILE_STEPS} steps. Speed-up: the unfused variant's time over the fused one's, "
        "and round by round (the variants are timed in the same rounds); the target: fewer kernels per step and "
        "faster in the median and in every round.",
        common.markdown_table(["variant", "step ms", "rounds", "reps", "fused speed-up", "kernels", "copies", "launch calls",
                               "check", "max rel err", "captured epilogues", "note"], table),
    ]) + "\n"


def parse_args(argv=None, ws: int | None = None):
    """``ws``: the world size the defaults are for (default: torchrun's WORLD_SIZE)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", type=Path, required=True)
    p.add_argument("--block", choices=("tp", "swiglu"), default="tp")
    p.add_argument("--mode", choices=("inference", "train"), default="inference")
    p.add_argument("--lowerings", default=None, help="comma-separated: symm,p2p (default: symm on CUDA, p2p on CPU)")
    p.add_argument("--steps", type=int, default=30, help="at least this many timed steps")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds over the variants")
    p.add_argument("--quick", action="store_true", help="10 timed steps, 2 rounds")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--no-inductor", dest="inductor", action="store_false", help="CPU smoke: no Inductor codegen")
    p.add_argument("--trace", default=None, help="write the profiler traces (ranks 0 and 1) here")
    p.add_argument("--cudagraphs", action="store_true",
                   help="compile every variant with mode='reduce-overhead' (CUDA graphs): files *_cudagraphs_ws<N>")
    p.add_argument("--verbose", action="store_true")
    for k in ("batch", "seq", "hidden", "heads", "ffn"):
        p.add_argument(f"--{k}", type=int, default=None)
    p.add_argument("--dtype", choices=tuple(DTYPES), default=None)
    args = p.parse_args(argv)
    ws = common.env_world_size() if ws is None else ws
    defaults = GPU_DEFAULTS if args.device == "cuda" else common.cpu_block_sizes(ws)
    for k in ("batch", "seq", "hidden", "heads", "ffn", "dtype"):
        if getattr(args, k) is None:
            setattr(args, k, defaults[k])
    if args.lowerings is None:
        args.lowerings = "symm" if args.device == "cuda" else "p2p"
    if args.quick:
        args.steps, args.rounds = 10, 2
    if args.cudagraphs and args.device != "cuda":
        p.error("--cudagraphs needs --device cuda")
    return args


def _tag(args) -> str:
    return "_cudagraphs" if args.cudagraphs else ""


def main(argv=None) -> int:
    args = parse_args(argv)
    rank, ws, device = common.init_distributed(args.device)
    # the TP block splits seq, heads and ffn; the SwiGLU MLP (no attention) seq and ffn
    why = common.block_sizes_problem(args.seq, args.hidden, args.heads if args.block == "tp" else None, args.ffn, ws)
    if why:
        if rank == 0:
            print(f"bench_epilogue: {why} (seq, heads and ffn are split over the ranks)", file=sys.stderr)
        dist.destroy_process_group()
        return 2
    info = common.machine_info(device, ws)
    timing = common.Timing(device, min_reps=args.steps)
    g = torch.Generator(device=device).manual_seed(1)
    x_full = torch.randn(args.batch, args.seq, args.hidden, generator=g, device=device).to(DTYPES[args.dtype])
    x = x_full.chunk(ws, dim=1)[rank].contiguous()
    ref = reference(build_block(args, ws, device), x.detach().clone().requires_grad_(args.mode == "train"), args.mode)
    rows, ok = [], True
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.out_dir / f"epilogue_{args.block}_{args.mode}{_tag(args)}_ws{ws}"
    # Every variant stays compiled until the timing rounds (one model and backend each): no reset in
    # between, and room for their cache entries.
    torch._dynamo.reset()
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 4 * len(variants(args)))
    steps = []
    for name, kw in variants(args):
        row, step = run_variant(name, kw, args, ws, device, x, ref)
        rows.append(row)
        steps.append(step)
        ok &= row["check"] in ("PASS", "—")
        if rank == 0:
            print(f"{name}: kernels/step {row['kernels_per_step']}, "
                  f"{row['check']} ({row['max_rel_err']}), epilogues {row['epilogues']}", flush=True)
            for kname, ms, calls in row.get("top_kernels") or []:
                print(f"    {ms:8.3f} ms/step {calls:5.1f}x  {kname}", flush=True)
    time_rounds(rows, steps, args.rounds, timing)
    if rank == 0:
        text = render(rows, info, args, ws)
        stem.with_suffix(".md").write_text(text)
        common.write_json(stem.with_suffix(".json"), {"info": info, "args": vars(args), "rows": rows})
        print(text)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
