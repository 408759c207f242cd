"""End-to-end benchmark: forward + backward step time of the demo's tensor-parallel transformer block.

    torchrun --nproc-per-node=N bench/suites/bench_block.py --out-dir DIR [--quick] [--trace TRACE_DIR]
        [--variants eager,inductor,async_tp,overlap,overlap_p2p,overlap_symm]
        [--batch B --seq S --hidden H --heads NH --ffn F --dtype bfloat16]

The block is :class:`overlap_backend.models.TPBlock` (Megatron-style TP + sequence parallelism with
functional collectives: one all-gather feeding Q/K/V, out-proj + reduce-scatter, all-gather + fc1,
fc2 + reduce-scatter), at the demo's GPU sizes by default (``overlap_backend.examples.demo.GPU_DEFAULTS``:
batch 4, seq 2048, hidden 4096, 32 heads, ffn 14336, bf16). Every rank builds the same weights
(same seed) and holds its sequence shard of the same input. Variants:

- ``eager``: the module as is (the reference of every check);
- ``inductor``: ``torch.compile`` with Inductor;
- ``async_tp``: Inductor with ``torch._inductor.config._micro_pipeline_tp = True`` (torch's async-TP:
  all-gather/reduce-scatter + matmul fused into ``symm_mem.fused_*`` ops) on a group with symmetric
  memory enabled; the number of fused ops found is reported;
- ``overlap``: ``backend="overlap"`` as a user gets it (``make_backend()``: lowering ``auto``, the cost
  model deciding where a rewrite pays; on CPU every match is rewritten): the target "never slower than
  Inductor by more than 2%" is this row;
- ``overlap_p2p`` / ``overlap_symm``: ``torch.compile(backend=overlap_backend.make_backend(lowering=...,
  cost_model="off"))``: every match rewritten on that lowering, what the ops themselves do;
  the rewrites applied (from the backend's reports) are reported.

Each compiled variant is checked first: forward output, input gradient and every weight gradient
against eager (relative error ``||a - b|| / ||b||``, max over ranks; <= 1e-2 in bf16, 1e-4 in fp32,
no NaN: else FAIL), then timed: warm-up, then the median of >= 30 steps (``--quick``: >= 10) each
bracketed by CUDA events, maximum over ranks. A variant this machine or torch cannot run is
``n/a: reason``. Rank 0 writes ``DIR/block_ws<N>.md`` and ``.json`` (rewritten after each variant).
With ``--trace``, after all timing, one torch.profiler trace of one step per variant goes to
``TRACE_DIR/block_ws<N>_<variant>_rank<R>.json`` (ranks 0 and 1). Exit status 1 if a check of an
overlap variant FAILs or it raises. See bench/README.md.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # repo root: overlap_backend, bench

from bench.tools import common  # noqa: E402  (sets the NVLink-multicast-off environment first)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import overlap_backend  # noqa: E402
from overlap_backend.examples.demo import GPU_DEFAULTS, fwd_bwd  # noqa: E402
from overlap_backend.models import TPBlock  # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TOL = {torch.bfloat16: 1e-2, torch.float16: 1e-2, torch.float32: 1e-4}
# --device cpu (hidden, gloo smoke test): tiny sizes, float32 (up to 4 ranks; beyond, one head per rank:
# common.cpu_block_sizes).
CPU_SIZES = common.cpu_block_sizes(2)

VARIANTS = ("eager", "inductor", "async_tp", "overlap", "overlap_p2p", "overlap_symm")
LABELS = {
    "eager": "eager",
    "inductor": "Inductor",
    "async_tp": "Inductor + async-TP",
    "overlap": "overlap (defaults)",
    "overlap_p2p": "overlap p2p",
    "overlap_symm": "overlap symm",
}
OURS = ("overlap", "overlap_p2p", "overlap_symm")
TRACE_WARMUP = 2
# Exceptions by which the backend or a lowering says "not available here": n/a, not a failure.
_UNSUPPORTED = tuple(c for c in (overlap_backend.ConfigError, overlap_backend.runtime.LoweringError, NotImplementedError,
                                 getattr(getattr(overlap_backend.runtime, "symm", None), "SymmUnavailable", None))
                     if c is not None)
_SYMM_FUSED = ("fused_all_gather_matmul", "fused_matmul_reduce_scatter",
               "fused_all_gather_scaled_matmul", "fused_scaled_matmul_reduce_scatter")


# ------------------------------------------------------------------------------ helpers
def _short(e: BaseException, n: int = 200) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"[:n]


def _agree(item: tuple[str, str] | None) -> tuple[str, str] | None:
    """The same decision on every rank: ``(kind, reason)`` of the first rank that has one, else None.

    The reason is prefixed with that rank when the ranks do not all report the same thing.
    """
    got: list = [None] * dist.get_world_size()
    dist.all_gather_object(got, item)
    have = [(r, it) for r, it in enumerate(got) if it is not None]
    if not have:
        return None
    kinds = {it[0] for _, it in have}
    kind = "ERROR" if "ERROR" in kinds else have[0][1][0]
    r, (_, reason) = have[0]
    same = len(have) == len(got) and all(it == have[0][1] for _, it in have)
    return kind, reason if same else f"rank {r}: {reason}"


def _graph_kind(graph: torch.fx.Graph) -> str:
    names = [n.name for n in graph.nodes if n.op == "placeholder"]
    if any(n.startswith("tangents") for n in names):
        return "bwd"
    return "fwd" if names and all(n.startswith("primals") for n in names) else "inference"


def drop_collectives(graph: torch.fx.Graph, dropped: Counter | None = None) -> None:
    """Replace every functional collective of a post-grad graph by a local stand-in of the same
    shape and dtype that moves about as many bytes through this GPU's memory (all-gather: the shard
    repeated; reduce-scatter: a copy of this rank's slice; all-reduce and equal-split all-to-all: a
    copy), and drop the waits. The graph then computes garbage, as fast as the same graph would
    with free communication: a bench variant that bounds what any overlap can gain, never a result."""
    c10d = torch.ops._c10d_functional
    aten = torch.ops.aten
    for n in list(graph.nodes):
        if n.op != "call_function":
            continue
        x = n.args[0] if n.args else None
        if n.target is c10d.all_gather_into_tensor.default:
            gs = n.args[1]
            rep = [gs] + [1] * (x.meta["val"].dim() - 1)
            with graph.inserting_before(n):
                new = graph.call_function(aten.repeat.default, (x, rep))
        elif n.target is c10d.reduce_scatter_tensor.default:
            rows = n.meta["val"].shape[0]
            with graph.inserting_before(n):
                new = graph.call_function(aten.clone.default, (graph.call_function(aten.slice.Tensor, (x, 0, 0, rows)),))
        elif n.target is c10d.all_reduce.default or (
                n.target is c10d.all_to_all_single.default and n.meta["val"].shape == x.meta["val"].shape):
            with graph.inserting_before(n):
                new = graph.call_function(aten.clone.default, (x,))
        elif n.target is c10d.wait_tensor.default:
            n.replace_all_uses_with(x)
            graph.erase_node(n)
            continue
        else:
            continue
        new.meta.update(n.meta)
        n.replace_all_uses_with(new)
        graph.erase_node(n)
        if dropped is not None:
            dropped[n.target.__name__.split(".")[0]] += 1
    graph.eliminate_dead_code()


def inductor_backend(micro_pipeline_tp: bool, fused: Counter, no_comm: bool = False):
    """Inductor (``compile_fx``), optionally with async-TP, counting the ``symm_mem.fused_*`` ops that
    end up in each post-grad graph. A fresh callable per variant: Dynamo keeps one cache entry per
    backend, so two variants of the same module class never share a compiled graph. ``no_comm``:
    every collective replaced by a local stand-in (``drop_collectives``; counted in ``fused`` as
    "dropped <op>"): the step time with free communication, a bound, not a result."""
    from torch._inductor.compile_fx import compile_fx

    def count_fused(graph: torch.fx.Graph) -> None:  # runs after the micro-pipeline pass
        if no_comm:
            dropped: Counter = Counter()
            drop_collectives(graph, dropped)
            for k, v in dropped.items():
                fused[f"dropped {k}"] += v
        kind = _graph_kind(graph)
        for n in graph.nodes:
            name = getattr(n.target, "__name__", str(n.target))
            if n.op == "call_function" and any(name.startswith(f) for f in _SYMM_FUSED):
                fused[f"{kind} {name.split('.')[0]}"] += 1

    patches = {"post_grad_custom_post_pass": count_fused, "fx_graph_cache": False}
    if micro_pipeline_tp:
        patches["_micro_pipeline_tp"] = True

    def backend(gm, example_inputs, mode=None, options=None):  # what torch.compile(mode=...) passes on
        from torch._inductor import list_mode_options

        with torch._functorch.config.patch(enable_autograd_cache=False):
            return compile_fx(gm, example_inputs,
                              config_patches={**(list_mode_options(mode) if mode else {}), **(options or {}), **patches})

    return backend


def _enable_symm_mem(gn: str) -> str | None:
    """Enable symmetric memory for the group (what async-TP needs); the reason if it cannot be."""
    try:
        from torch.distributed import _symmetric_memory as symm_mem

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if hasattr(symm_mem, "enable_symm_mem_for_group"):
                symm_mem.enable_symm_mem_for_group(gn)
            if hasattr(symm_mem, "is_symm_mem_enabled_for_group") and not symm_mem.is_symm_mem_enabled_for_group(gn):
                return "symmetric memory is not enabled for the group after enable_symm_mem_for_group"
        # async-TP may take a multimem (NVLink multicast) path; multicast must stay off on these machines.
        from torch._C._autograd import DeviceType
        from torch._C._distributed_c10d import _SymmetricMemory

        if _SymmetricMemory.has_multicast_support(DeviceType.CUDA, torch.cuda.current_device()):
            return ("symmetric memory reports NVLink multicast support although TORCH_SYMM_MEM_DISABLE_MULTICAST=1; "
                    "not running async-TP (multicast must stay off)")
    except Exception as e:  # noqa: BLE001
        return f"enabling symmetric memory for the group: {_short(e)}"
    return None


def _rewrites_overlap(backend) -> tuple[str, list]:
    applied: Counter = Counter()
    rejected = []
    for g in backend.reports:
        g = g.to_json()
        kind = {"forward": "fwd", "backward": "bwd"}.get(g["kind"], g["kind"])
        for m in g["matches"]:
            if m["applied"]:
                applied[f"{kind} {m['pass']}"] += 1
            else:
                rejected.append({"graph": g["id"], "pass": m["pass"], "reason": m["reason"]})
    text = _fmt_counter(applied) or "none"
    if rejected:
        text += f" ({len(rejected)} seen, not rewritten)"
    return text, rejected


def _symm_paths():
    """The symm lowering's per-process call counter ({"ag_mm:symm": n, "mm_rs:p2p": n, ...}), if it has one."""
    return getattr(getattr(getattr(overlap_backend.runtime, "symm", None), "lowering_helpers", None), "PATHS", None)


def _fmt_counter(c: Counter) -> str:
    """{"fwd ag_mm": 2, "bwd mm_rs": 1} -> "fwd ag_mm×2; bwd mm_rs×1" (fwd first)."""
    kinds: dict[str, list[str]] = {}
    for key in sorted(c, key=lambda k: (k.split()[0] != "fwd", k)):
        kind, what = key.split(" ", 1)
        kinds.setdefault(kind, []).append(f"{what}×{c[key]}")
    return "; ".join(f"{kind} {' '.join(items)}" for kind, items in kinds.items())


# ------------------------------------------------------------------------------ one variant
class Bench:
    def __init__(self, args, ws: int, device: torch.device, dtype, info: dict, out_dir: Path):
        self.args, self.ws, self.device, self.dtype, self.info = args, ws, device, dtype, info
        self.out_dir = out_dir
        self.rank = dist.get_rank()
        self.gn = common.group_name()
        self.tol = TOL[dtype]
        if args.quick:
            self.timing = common.Timing(device, warmup_ms=20, rep_ms=50, min_reps=10, max_reps=20, min_warmup=2)
        else:
            self.timing = common.Timing(device, warmup_ms=100, rep_ms=500, min_reps=30, max_reps=60, min_warmup=5)
        self.rows: list[dict] = []
        self.models: dict[str, tuple] = {}  # timed variants (module, input), kept for --trace
        self.ok = True
        gen = torch.Generator(device=device).manual_seed(args.seed + 1)
        full = (args.batch, args.seq, args.hidden)
        x_full = torch.randn(full, generator=gen, device=device, dtype=torch.float32).to(dtype)
        g_full = torch.randn(full, generator=gen, device=device, dtype=torch.float32).to(dtype)
        self.x = x_full.chunk(ws, dim=1)[self.rank].contiguous()
        self.grad_out = g_full.chunk(ws, dim=1)[self.rank].contiguous()
        self.ref = None  # eager output, input grad, weight grads

    def block(self) -> TPBlock:
        a = self.args
        return TPBlock(a.hidden, a.heads, a.ffn, group=dist.group.WORLD, dtype=self.dtype, device=self.device,
                       seed=a.seed)

    def reference(self) -> None:
        eager = self.block()
        x = self.x.detach().clone().requires_grad_()
        out = fwd_bwd(eager, x, self.grad_out)
        self.ref = {"output": out.detach(), "input grad": x.grad.detach(),
                    **{f"grad {n}": p.grad.detach() for n, p in eager.named_parameters()}}
        self.eager = eager

    def check(self, model) -> dict[str, float]:
        x = self.x.detach().clone().requires_grad_()
        out = fwd_bwd(model, x, self.grad_out)
        mine = {"output": out, "input grad": x.grad}
        for n, p in model.named_parameters():
            mine[f"grad {n.removeprefix('_orig_mod.')}"] = p.grad
        names = list(self.ref)
        errs = [common.rel_err(mine[n], self.ref[n]) if mine.get(n) is not None else math.inf for n in names]
        return dict(zip(names, common.allreduce_max(errs, self.device)))

    # -------------------------------------------------------------- availability
    def unavailable(self, name: str) -> str | None:
        cpu = self.device.type == "cpu"
        if name == "async_tp":
            if cpu:
                return "async-TP (_micro_pipeline_tp) needs CUDA, NCCL and symmetric memory"
            if not hasattr(torch._inductor.config, "_micro_pipeline_tp"):
                return f"torch {torch.__version__} has no torch._inductor.config._micro_pipeline_tp"
            return _enable_symm_mem(self.gn)
        if name == "inductor" and cpu and not self.args.cpu_inductor:
            return ("skipped in the --device cpu smoke mode (Inductor's C++ codegen takes ~25 s per graph; "
                    "--cpu-inductor includes it)")
        if name == "overlap_symm":
            if cpu:
                return "the symm lowering needs CUDA (one node, NVLink/P2P)"
            have = overlap_backend.runtime.available()
            if "symm" not in have:
                return f"lowering 'symm' is not registered (overlap_backend.runtime.available() = {have})"
        return None

    def build(self, name: str):
        """(compiled module, info callable returning (rewrites text, details))."""
        model = self.block()
        if name in ("inductor", "async_tp"):
            fused: Counter = Counter()
            compiled = torch.compile(model, backend=inductor_backend(name == "async_tp", fused))
            return compiled, lambda: (_fmt_counter(fused) or ("none" if name == "async_tp" else "—"), dict(fused))
        if name == "overlap":  # what a user gets: lowering auto, the cost model deciding
            lowering = None
            backend = overlap_backend.make_backend(inductor=self.inductor_for_ours())
        else:  # every match rewritten with the lowering named (the cost model would keep some plain on GPUs)
            lowering = name.removeprefix("overlap_")
            backend = overlap_backend.make_backend(lowering=lowering, inductor=self.inductor_for_ours(),
                                                   cost_model="off")
        compiled = torch.compile(model, backend=backend)

        paths = _symm_paths() if lowering in ("symm", None) else None
        before = Counter(paths) if paths is not None else None

        def info():  # called after the first step (the check)
            text, rejected = _rewrites_overlap(backend)
            details = {"config": {"lowering": backend.config.lowering, "inductor": backend.config.inductor,
                                  "passes": list(backend.config.passes)},
                       "not_rewritten": rejected}
            if before is not None:
                # Which ops the symm lowering ran on its kernels and which on its p2p fallback, in one step.
                calls = Counter({k: v for k, v in (Counter(paths) - before).items() if v > 0})
                details["symm_calls_per_step"] = dict(calls)
                if calls or lowering == "symm":  # (auto on a machine without symm: nothing to say)
                    text += f"; calls/step: {' '.join(f'{k}×{v}' for k, v in sorted(calls.items())) or 'none'}"
            return text, details

        return compiled, info

    def inductor_for_ours(self) -> bool:
        return self.device.type == "cuda" or self.args.cpu_inductor

    def compiler(self, name: str) -> str:
        if name == "eager":
            return "—"
        if name in OURS and not self.inductor_for_ours():
            return "no Inductor codegen (inductor=False, CPU smoke)"
        return "Inductor" + (" (_micro_pipeline_tp=True)" if name == "async_tp" else "")

    # -------------------------------------------------------------- one variant
    def run(self, name: str) -> None:
        row = {"variant": name, "label": LABELS[name], "compiler": self.compiler(name), "time_ms": None,
               "reps": None, "compile_s": None, "step_mem_gib": None, "check": "—", "max_rel_err": None,
               "worst": None, "errs": {}, "rewrites": "—", "details": {}, "note": None}
        self.rows.append(row)
        reason = self.unavailable(name)
        got = _agree(None if reason is None else ("n/a", reason))
        if got is not None:
            row["check"], row["note"] = "n/a", f"n/a: {got[1]}"
            return self.write()
        if name == "eager":
            model = self.eager
        else:
            mine = None
            try:
                model, info = self.build(name)
                t0 = time.perf_counter()
                errs = self.check(model)  # the first call: compiles forward and backward
                row["compile_s"] = common.allreduce_max([time.perf_counter() - t0], self.device)[0]
                row["rewrites"], row["details"] = info()
            except Exception as e:  # noqa: BLE001
                if self.args.verbose:
                    traceback.print_exc()
                # Ours raising is an ERROR unless it says "not supported here"; a baseline raising is n/a.
                kind = "n/a" if name not in OURS or isinstance(e, _UNSUPPORTED) else "ERROR"
                mine = (kind, f"raised at compile/first call: {_short(e)}")
            got = _agree(mine)
            if got is not None:
                # A variant that raised on any rank is not called again (a rank stuck in it would hang the others).
                row["check"], row["note"] = got[0], f"{got[0]}: {got[1]}"
                if got[0] == "ERROR":
                    self.ok = False
                return self.write()
            worst = max(errs, key=lambda k: (math.isnan(errs[k]), errs[k]))
            err = errs[worst]
            row.update(errs=errs, worst=worst, max_rel_err=err)
            row["check"] = "PASS" if math.isfinite(err) and err <= self.tol else "FAIL"
            notes = []
            if row["check"] == "FAIL":
                notes.append(f"FAIL: {worst} relative error {err:.3e} vs eager (tolerance {self.tol:g}); timed anyway")
                if name in OURS:
                    self.ok = False
            if name == "async_tp" and not row["details"]:
                notes.append("async-TP fused nothing: this variant ran as plain Inductor")
            row["note"] = "; ".join(notes) or None
        x = self.x.detach().clone().requires_grad_()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        try:
            row["time_ms"], row["reps"] = self.timing.bench(lambda: fwd_bwd(model, x, self.grad_out))
        except Exception as e:  # noqa: BLE001
            row["note"] = f"n/a: timing raised {_short(e)}"
            if name in OURS:
                self.ok = False
            return self.write()
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device) - base
            row["step_mem_gib"] = common.allreduce_max([peak / 2**30], self.device)[0]
        self.models[name] = (model, x)
        self.write()

    def interleave(self, rounds: int) -> None:
        """``rounds`` more timings of every variant that was timed, interleaved (``common.time_in_rounds``)."""
        timed = []
        for row in self.rows:
            if row["variant"] in self.models and row["time_ms"] is not None:
                model, x = self.models[row["variant"]]
                row["round_ms"] = [row["time_ms"]]
                timed.append((row, lambda model=model, x=x: fwd_bwd(model, x, self.grad_out)))
        common.time_in_rounds(timed, rounds, self.timing)
        self.write()

    # -------------------------------------------------------------- output
    def write(self) -> None:
        if self.rank != 0:
            return
        r = self.rows[-1]
        print(f"[block ws={self.ws}] {r['variant']}: time={common.fmt_ms(r['time_ms'])} ms, check={r['check']}"
              + (f" ({r['max_rel_err']:.1e}, {r['worst']})" if r["max_rel_err"] is not None else "")
              + (f", compile {r['compile_s']:.1f} s" if r["compile_s"] is not None else "")
              + (f", rewrites: {r['rewrites']}" if r["rewrites"] != "—" else "")
              + (f"\n    {r['note']}" if r["note"] else ""), flush=True)
        stem = self.out_dir / f"block_ws{self.ws}"
        stem.with_suffix(".md").write_text(self.render())
        common.write_json(stem.with_suffix(".json"), {
            "benchmark": "block", "world_size": self.ws, "dtype": str(self.dtype), "sizes": self.sizes(),
            "tolerance": self.tol, "machine": self.info, "variants": self.rows,
        })

    def sizes(self) -> dict:
        a = self.args
        return {"batch": a.batch, "seq": a.seq, "hidden": a.hidden, "heads": a.heads, "ffn": a.ffn}

    def render(self) -> str:
        times = {r["variant"]: r["time_ms"] for r in self.rows}
        headers = ["variant", "compiler", "step ms", "vs eager", "vs Inductor", "first call s (compile)",
                   "step mem GiB", "rewrites / fused ops", "check (max rel err, worst)", "reps"]
        body, notes = [], []
        for r in self.rows:
            t = r["time_ms"]
            ok = r["check"] in ("PASS", "—") and t is not None

            def ratio(base):
                return f"{base / t:.2f}×" if ok and base is not None else "—"

            check = r["check"]
            if r["max_rel_err"] is not None:
                check += f" ({r['max_rel_err']:.1e}, {r['worst']})"
            body.append([r["label"], r["compiler"], common.fmt_ms(t), ratio(times.get("eager")),
                         ratio(times.get("inductor")),
                         "—" if r["compile_s"] is None else f"{r['compile_s']:.1f}",
                         "—" if r["step_mem_gib"] is None else f"{r['step_mem_gib']:.2f}",
                         r["rewrites"], check, r["reps"] if r["reps"] is not None else "—"])
            if r["note"]:
                notes.append(f"- {r['label']}: {r['note']}")
        a = self.args
        timer = "CUDA events" if self.device.type == "cuda" else "the wall clock (CPU smoke test: times mean nothing)"
        parts = [
            f"# TP transformer block, forward + backward, world size {self.ws}, "
            f"{str(self.dtype).removeprefix('torch.')}",
            "",
            f"`overlap_backend.models.TPBlock` (sequence parallel): batch {a.batch}, seq {a.seq} (each rank "
            f"{a.seq // self.ws}), hidden {a.hidden}, {a.heads} heads, ffn {a.ffn}. Step = forward + backward "
            f"of the block with fresh gradients. Times in ms: per-rank median of the timed steps "
            f"({timer}, after warm-up), maximum over ranks, then the median of {1 + a.rounds} interleaved rounds "
            f"over the variants (the JSON's round_ms); vs eager / vs Inductor = their step time / this "
            f"variant's (— when the check did not PASS). Check: output, input grad and every weight grad "
            f"against eager, relative error, worst tensor and rank (tolerance {self.tol:g}). step mem = peak "
            f"memory allocated during the timed steps above what was allocated before (max over ranks). "
            f"Rewrites: the overlap backend's applied rewrites per graph (fwd/bwd); for async-TP the "
            f"`symm_mem.fused_*` ops in the post-grad graphs.",
            "",
            common.info_markdown(self.info),
            "",
            common.markdown_table(headers, body),
        ]
        if notes:
            parts += ["", *notes]
        return "\n".join(parts) + "\n"

    # -------------------------------------------------------------- traces
    def traces(self, trace_dir: Path) -> int:
        """One profiler trace of ONE step per timed variant (after warm-up), ranks common.TRACE_RANKS."""
        variants = [(name, functools.partial(fwd_bwd, model, x, self.grad_out))
                    for name, (model, x) in self.models.items()]
        return len(common.write_traces(variants, trace_dir, self.device, f"block_ws{self.ws}", warmup=TRACE_WARMUP))


# ------------------------------------------------------------------------------ main
def parse_args(argv=None, ws: int | None = None):
    """``ws``: the world size the defaults are for (default: torchrun's WORLD_SIZE)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Run under torchrun, one process per GPU. See bench/README.md.")
    p.add_argument("--out-dir", default="bench/results", help="where rank 0 writes block_ws<N>.md/.json")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma-separated, out of {', '.join(VARIANTS)} (default: all; eager is always run, "
                        "it is the reference)")
    p.add_argument("--quick", action="store_true", help="smoke test: >= 10 timed steps instead of >= 30")
    p.add_argument("--rounds", type=int, default=3,
                   help="after every variant was timed once, this many more interleaved rounds over them "
                        "(a variant's time: the median of its rounds)")
    p.add_argument("--trace", metavar="DIR", default=None,
                   help="after all timing, write one torch.profiler (Chrome/Perfetto JSON) trace of one step per "
                        "variant to DIR/block_ws<N>_<variant>_rank<R>.json, ranks 0 and 1 only")
    for dim in ("batch", "seq", "hidden", "heads", "ffn"):
        p.add_argument(f"--{dim}", type=int, default=None,
                       help=f"default {GPU_DEFAULTS[dim]} (the demo's GPU size)" + (" (global; each rank holds seq / N)"
                                                                                   if dim == "seq" else ""))
    p.add_argument("--dtype", choices=tuple(DTYPES), default=None, help="default bfloat16 (float32 with --device cpu)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verbose", action="store_true", help="print tracebacks of variants that raise")
    # Hidden: the CPU smoke test (gloo, tiny float32 block; Inductor variants skipped unless --cpu-inductor).
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help=argparse.SUPPRESS)
    p.add_argument("--cpu-inductor", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in chosen if v not in VARIANTS]
    if bad:
        p.error(f"--variants: unknown {bad}; allowed: {', '.join(VARIANTS)}")
    args.variants = [v for v in VARIANTS if v in chosen or v == "eager"]
    ws = common.env_world_size() if ws is None else ws
    defaults = (common.cpu_block_sizes(ws) if args.device == "cpu"
                else {**GPU_DEFAULTS, "dtype": GPU_DEFAULTS.get("dtype", "bfloat16")})
    for key in ("batch", "seq", "hidden", "heads", "ffn", "dtype"):
        if getattr(args, key) is None:
            setattr(args, key, defaults[key])
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_block: CUDA is not available (use the device machine)", file=sys.stderr)
        return 2
    rank, ws, device = common.init_distributed(args.device)
    why = common.block_sizes_problem(args.seq, args.hidden, args.heads, args.ffn, ws)
    if why:
        if rank == 0:
            print(f"bench_block: {why} (seq, heads and ffn are split over the ranks)", file=sys.stderr)
        dist.destroy_process_group()
        return 2
    if device.type == "cpu":
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    dtype = DTYPES[args.dtype]
    out_dir = Path(args.out_dir)
    trace_dir = Path(args.trace) if args.trace else None
    if rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
    if trace_dir is not None and rank in common.TRACE_RANKS:
        trace_dir.mkdir(parents=True, exist_ok=True)
    info = common.machine_info(device, ws)
    info.update(dtype=str(dtype), quick=args.quick, lowerings_registered=list(overlap_backend.runtime.available()))
    bench = Bench(args, ws, device, dtype, info, out_dir)
    try:
        bench.reference()
        for name in args.variants:
            bench.run(name)
            common.synchronize(device)
            dist.barrier()
        bench.interleave(args.rounds)
        if trace_dir is not None:
            n = bench.traces(trace_dir)
            if rank == 0:
                print(f"bench_block: {n} trace(s) per traced rank written to {trace_dir} "
                      f"(ranks {', '.join(map(str, common.TRACE_RANKS))})", flush=True)
        common.synchronize(device)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        print((out_dir / f"block_ws{ws}.md").read_text(), flush=True)
        print("bench_block: all checks of the overlap variants PASS (or n/a)" if bench.ok
              else "bench_block: a check of an overlap variant FAILED or it raised", flush=True)
    return 0 if bench.ok else 1


if __name__ == "__main__":
    common.exit_now(main())
