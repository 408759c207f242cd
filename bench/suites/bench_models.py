"""Real models end to end: Llama TP+SP training, Mixtral EP training, their loss curves, serving.

    torchrun --nproc-per-node=N bench/suites/bench_models.py --out DIR [--sections llama,curve,mixtral,mixtral_curve,serve]
        [--variants eager,inductor,async_tp,overlap] [--compile block|model] [--quick]
        [--llama k=v,...] [--curve k=v,...] [--mixtral k=v,...] [--mixtral_curve k=v,...] [--serve k=v,...]

Sections (each on fresh models built from the same seed; ``torch._dynamo.reset()`` between them):

- ``llama``: :mod:`overlap_backend.models.llama` with tensor + sequence parallelism over the N ranks
  (``parallelize_llama``: DTensor ``parallelize_module``, torchtitan's plan), bf16, AdamW. Variants:
  ``eager``; ``inductor``; ``async_tp`` (Inductor with ``_micro_pipeline_tp = True`` on a group with
  symmetric memory enabled, as bench_block.py); ``overlap`` (``backend=overlap_backend.make_backend()``,
  its defaults and the ``OVERLAP_*`` environment); optional ``overlap_p2p``. Compiled per
  transformer block (torchtitan's way; ``--compile model``: one graph). Check: the losses of the
  first ``--check-steps`` steps against eager's (same init, same batches; relative, <= 1e-2 in bf16).
  Then the step time: forward + backward + AdamW (``step ms``) and forward + backward alone
  (``fwd+bwd ms``), each the median of >= 30 steps (``--quick``: >= 10) bracketed by CUDA events after
  warm-up, maximum over ranks (``bench/tools/common.py``'s ``Timing``); tokens/s = batch x seq / step.
  The target: overlap >= 1.10x faster than Inductor and >= 1.05x than async-TP.
- ``curve``: a few hundred training steps (``steps``, default 300) of a smaller Llama (TP+SP) with
  ``eager`` and ``overlap`` (and ``inductor`` with ``--curve-variants``), the loss of every step in
  the JSON; max / mean relative difference to eager's curve, PASS if the max <= ``tol`` (default 2e-2 in
  bf16: rounding differences compound over the steps; 1e-4 in float32).
- ``mixtral``: :mod:`overlap_backend.models.mixtral`: MoE layers (capacity policy, ``grouped_mm`` experts)
  expert-parallel over the N ranks, everything else data-parallel (each rank its own batch, gradients
  of replicated weights all-reduced); variants eager / inductor / overlap (its ``moe`` pass rewrites
  the forward); step time as above, tokens/s over all ranks.
- ``mixtral_curve``: the same for a smaller Mixtral (expert parallel as in ``mixtral``, each rank its own
  batch; the loss is the mean over ranks).
- ``serve``: the Llama with plain TP (no SP: all-reduce after wo/w2, the ``mm_ar`` pass), static KV
  caches, a prompt batch prefilled then ``new_tokens`` greedy steps; variants eager / inductor /
  overlap; prefill ms and tokens/s, decode ms per step and tokens/s (wall clock with device
  synchronisation, median of ``reps`` generations after a warm-up one, max over ranks); check: the
  greedy tokens equal eager's (share of equal tokens; bf16 argmax near-ties may flip).

Sizes are ``key=value`` overrides of each section's defaults (``--llama dim=8192,n_layers=2,batch=2``;
keys: the config fields of ``LlamaConfig`` / ``MixtralConfig`` plus ``batch``, ``seq``, and for
``curve`` ``steps``, ``lr``, ``tol``, for ``serve`` ``prompt``, ``new_tokens``, ``reps``). The
defaults fit 2-4 H200s and keep the whole run to a few minutes (most of it compile time).

``--mode reduce-overhead``: every compiled variant with ``torch.compile(mode="reduce-overhead")``
(Inductor's CUDA graphs; the overlap backend's cost model then drops the host time of the ops a
graph captures), each model compiled as one graph (per block: pytorch#152887); results in
``models_cudagraphs_ws<N>``, graphs Inductor did not capture counted.

Rank 0 writes ``DIR/models_ws<N>.md`` and ``.json`` (machine, versions, command; rewritten after every
variant). Exit status 1 if an overlap variant's check FAILs or it raises.

CPU smoke test (hidden ``--device cpu``: gloo, float32, tiny sizes; Inductor variants n/a unless
``--cpu-inductor``, the overlap backend without Inductor codegen):
``torchrun --nproc-per-node=2 bench/suites/bench_models.py --device cpu --quick --out /tmp/models``.
"""

from __future__ import annotations

import argparse
import functools
import gc
import math
import os
import statistics
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
from bench.suites.bench_block import _enable_symm_mem, inductor_backend  # noqa: E402
from overlap_backend.models.llama import LlamaConfig, build_llama, compile_llama  # noqa: E402
from overlap_backend.models.mixtral import MixtralConfig, build_mixtral, sync_dense_grads  # noqa: E402
from overlap_backend.examples.serve import generate, random_prompts  # noqa: E402
from overlap_backend.examples.train import (  # noqa: E402
    compare_curves,
    loss_fn,
    make_optimizer,
    rank_rows,
    synthetic_batch,
    train,
    train_step,
)

warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
warnings.filterwarnings("ignore", category=UserWarning, module="torch.distributed")

SECTIONS = ("llama", "curve", "mixtral", "mixtral_curve", "serve")
VARIANTS = ("eager", "inductor", "async_tp", "overlap", "overlap_p2p", "inductor_nocomm")
DEFAULT_VARIANTS = ("eager", "inductor", "async_tp", "overlap")
LABELS = {"eager": "eager", "inductor": "Inductor", "async_tp": "Inductor + async-TP", "overlap": "overlap",
          "overlap_p2p": "overlap (p2p)", "inductor_nocomm": "Inductor, no communication (bound)"}
# inductor_nocomm: Inductor with every collective replaced by a local copy of its size
# (bench_block.drop_collectives): the step with free communication, i.e. the fastest any overlap of
# communication with computation could make it. Its losses are garbage (not checked); a bound, not a result.
BOUNDS = ("inductor_nocomm",)
OURS = ("overlap", "overlap_p2p")
BAR_VS_INDUCTOR, BAR_VS_ASYNC_TP, MAX_SLOWDOWN = 1.10, 1.05, 0.98
TOL = {torch.bfloat16: 1e-2, torch.float32: 1e-4}

# Defaults: 2-4 H200s (bf16). Llama-3-8B-shaped layers, fewer of them (compile time is per block
# anyway; the step time is what the layers are for).
GPU = {
    "llama": dict(vocab_size=32000, dim=4096, n_layers=4, n_heads=32, n_kv_heads=8, ffn_dim=14336, batch=4, seq=2048),
    "curve": dict(vocab_size=8192, dim=1024, n_layers=4, n_heads=16, n_kv_heads=4, ffn_dim=3584, batch=8, seq=1024,
                  steps=300, lr=1e-3, tol=2e-2),
    "mixtral": dict(vocab_size=32000, dim=4096, n_layers=2, n_heads=32, n_kv_heads=8, ffn_dim=14336, num_experts=8,
                    top_k=2, capacity_factor=1.25, batch=2, seq=2048),
    "mixtral_curve": dict(vocab_size=8192, dim=1024, n_layers=4, n_heads=16, n_kv_heads=4, ffn_dim=3584, num_experts=8,
                          top_k=2, capacity_factor=1.25, batch=4, seq=1024, steps=300, lr=1e-3, tol=2e-2),
    "serve": dict(vocab_size=32000, dim=4096, n_layers=4, n_heads=32, n_kv_heads=8, ffn_dim=14336, batch=8,
                  prompt=512, new_tokens=64, reps=3),
}
CPU = {
    "llama": dict(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, batch=2, seq=16),
    "curve": dict(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, batch=4, seq=16,
                  steps=20, lr=1e-2, tol=1e-4),
    "mixtral": dict(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, num_experts=4, top_k=2,
                    capacity_factor=2.0, batch=2, seq=8, expert_form="bmm"),
    "mixtral_curve": dict(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, num_experts=4,
                          top_k=2, capacity_factor=2.0, batch=2, seq=8, expert_form="bmm", steps=20, lr=1e-3, tol=1e-4),
    "serve": dict(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, batch=2, prompt=6,
                  new_tokens=6, reps=2),
}
RUN_KEYS = {"batch", "seq", "steps", "lr", "tol", "prompt", "new_tokens", "reps"}


# ------------------------------------------------------------------------------ arguments
def _overrides(text: str | None) -> dict:
    out = {}
    for item in filter(None, (text or "").split(",")):
        key, _, value = item.partition("=")
        for cast in (int, float):
            try:
                value = cast(value)
                break
            except ValueError:
                continue
        out[key.strip()] = value
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Run under torchrun, one process per GPU. See bench/README.md.")
    p.add_argument("--out", required=True, help="directory for models_ws<N>.md / .json (rank 0)")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated from {', '.join(SECTIONS)}")
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                   help=f"comma-separated from {', '.join(VARIANTS)} (eager is always run: the reference)")
    p.add_argument("--curve-variants", default="eager,overlap", help="variants of the loss-curve section")
    p.add_argument("--compile", choices=("block", "model"), default="block",
                   help="block: each transformer block (and the embedding) compiled on its own, as torchtitan; "
                        "model: the whole model as one graph")
    p.add_argument("--mode", choices=("default", "reduce-overhead"), default="default",
                   help="torch.compile's mode for every compiled variant (reduce-overhead: CUDA graphs; "
                        "results in models_cudagraphs_ws<N>.md / .json)")
    p.add_argument("--check-steps", type=int, default=3, help="training steps compared with eager before timing")
    p.add_argument("--quick", action="store_true", help="smoke run: >= 10 timed steps instead of >= 30")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verbose", action="store_true", help="print tracebacks of variants that raise")
    p.add_argument("--trace", metavar="DIR", default=None,
                   help="write a torch.profiler trace of one training step of each variant (ranks 0 and 1) into "
                        "DIR: <section>_ws<N>_<variant>_rank<R>.json; compare them with bench/tools/trace_compare.py")
    for section in SECTIONS:
        p.add_argument(f"--{section}", default=None, metavar="K=V,...",
                       help=f"size overrides; GPU defaults: {', '.join(f'{k}={v}' for k, v in GPU[section].items())}")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default=None, help="default bfloat16 (cpu: float32)")
    # Hidden: the CPU smoke test (gloo, tiny float32 models; Inductor variants n/a unless --cpu-inductor).
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help=argparse.SUPPRESS)
    p.add_argument("--cpu-inductor", action="store_true", help=argparse.SUPPRESS)
    common.add_set_argument(p)
    args = common.parse_args_with_sets(p, argv)
    args.sections = [s for s in args.sections.split(",") if s]
    args.variants = ["eager"] + [v for v in args.variants.split(",") if v and v != "eager"]
    args.curve_variants = ["eager"] + [v for v in args.curve_variants.split(",") if v and v != "eager"]
    for s in args.sections:
        if s not in SECTIONS:
            p.error(f"--sections: unknown {s!r}; allowed: {', '.join(SECTIONS)}")
    for v in args.variants + args.curve_variants:
        if v not in VARIANTS:
            p.error(f"unknown variant {v!r}; allowed: {', '.join(VARIANTS)}")
    base = CPU if args.device == "cpu" else GPU
    args.sizes = {s: {**base[s], **_overrides(getattr(args, s))} for s in SECTIONS}
    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    return args


def _split(sizes: dict) -> tuple[dict, dict]:
    """(model config fields, run parameters)."""
    return {k: v for k, v in sizes.items() if k not in RUN_KEYS}, {k: v for k, v in sizes.items() if k in RUN_KEYS}


# ------------------------------------------------------------------------------ helpers
def _short(e: BaseException, n: int = 240) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"[:n]


def _agree(mine: str | None) -> str | None:
    """A failure on any rank is a failure on all (the first rank's message)."""
    got: list = [None] * dist.get_world_size()
    dist.all_gather_object(got, mine)
    bad = [(r, m) for r, m in enumerate(got) if m is not None]
    return None if not bad else (bad[0][1] if len(bad) == len(got) else f"rank {bad[0][0]}: {bad[0][1]}")


def _rewrites(backend) -> tuple[str, list]:
    applied: Counter = Counter()
    rejected = []
    for g in backend.reports:
        kind = {"forward": "fwd", "backward": "bwd", "inference": "inf"}.get(g.kind, g.kind)
        for m in g.matches:
            if m.applied:
                applied[f"{kind} {m.pass_name}"] += 1
            else:
                rejected.append({"graph": g.id, "pass": m.pass_name, "reason": m.reason})
    text = "; ".join(f"{k}×{v}" for k, v in sorted(applied.items(), key=lambda kv: (kv[0].split()[0] != "fwd", kv[0])))
    text = text or "none"
    if rejected:
        text += f" ({len(rejected)} seen, not rewritten)"
    return text, rejected


def _cudagraph_skips() -> int:
    from torch._dynamo.utils import counters

    return int(counters["inductor"].get("cudagraph_skips", 0))


def _free(device) -> None:
    """Between variants. Under ``mode="reduce-overhead"`` the CUDA-graph trees (one memory pool per
    device, shared by every compiled function) are dropped too: a variant that raised at its first
    steps left live tensors in that pool, and the next variant then raised "Detected N tensor(s) in
    the cudagraph pool not tracked as outputs" (4xH200: async-TP raised, then ours; bench/results/models_h200x4_2026-11-30)."""
    gc.collect()
    if device.type == "cuda":
        from torch._inductor import cudagraph_trees

        cudagraph_trees.reset_cudagraph_trees()
        gc.collect()
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _mode_tag(mode: str) -> str:
    return "" if mode == "default" else "_cudagraphs"


def _ratio(base, t) -> str:
    return f"{base / t:.2f}×" if base and t else "—"


# ------------------------------------------------------------------------------ the benchmark
class Bench:
    def __init__(self, args, ws: int, device, info: dict, out_dir: Path):
        self.args, self.ws, self.device, self.info, self.out_dir = args, ws, device, info, out_dir
        self.rank = dist.get_rank()
        self.dtype = getattr(torch, args.dtype)
        self.tol = TOL[self.dtype]
        if args.quick:
            self.timing = common.Timing(device, warmup_ms=20, rep_ms=50, min_reps=10, max_reps=20, min_warmup=2)
        else:
            self.timing = common.Timing(device, warmup_ms=100, rep_ms=500, min_reps=30, max_reps=60, min_warmup=5)
        self.results: dict[str, dict] = {}
        self.ok = True
        self.mesh = None
        if {"llama", "curve", "serve"} & set(args.sections):
            from torch.distributed.device_mesh import init_device_mesh

            self.mesh = init_device_mesh(device.type, (ws,))

    # ------------------------------------------------------------------ compile a variant
    def unavailable(self, name: str) -> str | None:
        cpu = self.device.type == "cpu"
        if name == "async_tp":
            if cpu:
                return "async-TP (_micro_pipeline_tp) needs CUDA, NCCL and symmetric memory"
            if not hasattr(torch._inductor.config, "_micro_pipeline_tp"):
                return f"torch {torch.__version__} has no torch._inductor.config._micro_pipeline_tp"
            return _enable_symm_mem(common.group_name())
        if name in ("inductor", "inductor_nocomm") and cpu and not self.args.cpu_inductor:
            return "skipped in the --device cpu smoke mode (Inductor's C++ codegen: ~25 s per graph; --cpu-inductor)"
        return None

    def backend(self, name: str):
        """(backend callable or None for eager, info callable -> (rewrites text, details))."""
        if name == "eager":
            return None, lambda: ("—", {})
        if name in ("inductor", "async_tp", "inductor_nocomm"):
            fused: Counter = Counter()
            be = inductor_backend(name == "async_tp", fused, no_comm=name == "inductor_nocomm")
            return be, lambda: ("; ".join(f"{k}×{v}" for k, v in sorted(fused.items()))
                                or ("fused nothing" if name == "async_tp" else "—"), dict(fused))
        inductor = self.device.type == "cuda" or self.args.cpu_inductor
        kw = {"lowering": "p2p"} if name == "overlap_p2p" else {}
        be = overlap_backend.make_backend(inductor=inductor, **kw)

        def info():
            text, rejected = _rewrites(be)
            return text, {"config": {"lowering": be.config.lowering, "inductor": be.config.inductor,
                                     "passes": list(be.config.passes)}, "not_rewritten": rejected}

        return be, info

    def per_block(self, section: str) -> bool:
        """Compiled per transformer block? Not under CUDA graphs: a block's cudagraph output fed to
        the next call of the same compiled block is overwritten by that call (pytorch#152887, open),
        so every section is compiled as one graph there."""
        return self.args.compile == "block" and self.args.mode == "default"

    def compiled(self, model, name: str, section: str):
        be, info = self.backend(name)
        if be is not None:
            mode = {} if self.args.mode == "default" else {"mode": self.args.mode}
            model = compile_llama(model, be, per_block=self.per_block(section), dynamic=False, **mode)
            skips_before = _cudagraph_skips()

            def info_with_skips():  # graphs Inductor did not capture under reduce-overhead run eagerly
                text, details = info()
                skips = _cudagraph_skips() - skips_before
                if self.args.mode != "default":
                    details = {**details, "cudagraph_skips": skips}
                    if skips:
                        text += f"; {skips} graph(s) not captured"
                return text, details

            return model, info_with_skips
        return model, info

    # ------------------------------------------------------------------ training sections
    def training(self, section: str, build, batch: int, seq: int, vocab: int, data_parallel: bool,
                 grad_hook=None) -> None:
        """Check + time a training step of ``build()`` for every variant."""
        rows = []
        res = {"sizes": self.args.sizes[section], "variants": rows}
        self.results[section] = res
        k = self.args.check_steps
        ref_losses = None
        for name in self.args.variants:
            if name == "overlap_p2p" and self.device.type == "cpu":
                continue  # the same as overlap there
            if name == "async_tp" and data_parallel:
                continue  # no tensor parallelism: nothing for async-TP to fuse
            row = {"variant": name, "label": LABELS[name], "step_ms": None, "fwd_bwd_ms": None,
                   "tokens_per_s": None, "check": "—", "max_rel_loss_diff": None, "losses": None,
                   "rewrites": "—", "details": {}, "compile_s": None, "step_mem_gib": None, "note": None}
            rows.append(row)
            why = _agree(self.unavailable(name))
            if why is not None:
                row.update(check="n/a", note=f"n/a: {why}")
                self.write()
                continue
            model = opt = None
            err = None
            try:
                model = build()
                model, info = self.compiled(model, name, section)
                opt = make_optimizer(model)
                hook = functools.partial(grad_hook, model) if grad_hook else None
                t0 = time.perf_counter()
                losses = train(model, k, batch=batch, seq_len=seq, vocab=vocab, seed=self.args.seed,
                               device=self.device, data_parallel=data_parallel, grad_hook=hook, opt=opt)
                row["compile_s"] = common.allreduce_max([time.perf_counter() - t0], self.device)[0]
                row["losses"] = losses
                row["rewrites"], row["details"] = info()
            except Exception as e:  # noqa: BLE001
                err = f"raised at compile/first steps: {self._raised(e)}"
            err = _agree(err)
            if err is not None:
                self._failed(name, row, err)
                del model, opt
                _free(self.device)
                self.write()
                continue
            if name == "eager":
                ref_losses = losses
            elif name in BOUNDS:
                row["check"] = "n/a (bound)"
            elif ref_losses is not None:
                cmp = compare_curves(losses, ref_losses)
                row["max_rel_loss_diff"] = cmp["max_rel_diff"]
                good = math.isfinite(cmp["max_rel_diff"]) and cmp["max_rel_diff"] <= self.tol
                row["check"] = "PASS" if good else "FAIL"
                if not good:
                    row["note"] = f"FAIL: losses {losses} vs eager {ref_losses}; timed anyway"
                    self.ok &= name not in OURS
            if name == "async_tp" and not row["details"]:
                row["note"] = "async-TP fused nothing: this variant ran as plain Inductor"
            # timing on one fixed batch
            if data_parallel:
                inputs, targets = synthetic_batch(vocab, batch * self.ws, seq, 0, seed=self.args.seed,
                                                  device=self.device, rows=rank_rows(batch))
            else:
                inputs, targets = synthetic_batch(vocab, batch, seq, 0, seed=self.args.seed, device=self.device)
            try:
                self.time_training(row, model, opt, inputs, targets, data_parallel, grad_hook, section)
                row["tokens_per_s"] = batch * seq * (self.ws if data_parallel else 1) / (row["step_ms"] / 1e3)
            except Exception as e:  # noqa: BLE001
                row["note"] = f"timing raised {_short(e)}"
                self.ok &= name not in OURS
            del model, opt
            _free(self.device)
            self.write()

    def time_training(self, row: dict, model, opt, inputs, targets, data_parallel: bool, grad_hook,
                      section: str = "") -> None:
        """``step_ms`` (forward + backward + hook + AdamW), ``fwd_bwd_ms``, ``reps``, ``step_mem_gib``;
        with ``--trace``, a profiler trace of one step (``bench/tools/trace_compare.py`` compares them)."""
        scale = 1.0 / self.ws if data_parallel else 1.0
        hook = functools.partial(grad_hook, model) if grad_hook else None

        def step():
            train_step(model, opt, inputs, targets, loss_scale=scale, grad_hook=hook)

        def fwd_bwd():
            opt.zero_grad(set_to_none=True)
            (loss_fn(model(inputs), targets) * scale).backward()

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        row["step_ms"], row["reps"] = self.timing.bench(step)
        row["fwd_bwd_ms"], _ = self.timing.bench(fwd_bwd)
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device) - base
            row["step_mem_gib"] = common.allreduce_max([peak / 2**30], self.device)[0]
        if self.args.trace:
            stem = f"{section}{_mode_tag(self.args.mode)}_ws{self.ws}"
            Path(self.args.trace).mkdir(parents=True, exist_ok=True)
            row["traces"] = [str(p) for p in common.write_traces([(row["variant"], step)], Path(self.args.trace),
                                                                  self.device, stem, warmup=1)]
        opt.zero_grad(set_to_none=True)

    def llama(self) -> None:
        cfg_kw, run = _split(self.args.sizes["llama"])
        cfg = LlamaConfig(**cfg_kw, seq_len=run["seq"])
        cfg.check_tp(self.ws)

        def build():
            return build_llama(cfg, self.mesh, seed=self.args.seed, device=self.device, dtype=self.dtype)

        self.training("llama", build, run["batch"], run["seq"], cfg.vocab_size, data_parallel=False)

    def mixtral(self) -> None:
        cfg_kw, run = _split(self.args.sizes["mixtral"])
        cfg = MixtralConfig(**cfg_kw, seq_len=run["seq"])

        def build():
            return build_mixtral(cfg, seed=self.args.seed, device=self.device, dtype=self.dtype)

        self.training("mixtral", build, run["batch"], run["seq"], cfg.vocab_size, data_parallel=True,
                      grad_hook=sync_dense_grads)

    def curve(self) -> None:
        cfg_kw, run = _split(self.args.sizes["curve"])
        cfg = LlamaConfig(**cfg_kw, seq_len=run["seq"])
        cfg.check_tp(self.ws)
        self.loss_curve("curve", lambda: build_llama(cfg, self.mesh, seed=self.args.seed, device=self.device,
                                                     dtype=self.dtype), cfg.vocab_size, run, data_parallel=False)

    def mixtral_curve(self) -> None:
        cfg_kw, run = _split(self.args.sizes["mixtral_curve"])
        cfg = MixtralConfig(**cfg_kw, seq_len=run["seq"])
        self.loss_curve("mixtral_curve", lambda: build_mixtral(cfg, seed=self.args.seed, device=self.device,
                                                               dtype=self.dtype),
                        cfg.vocab_size, run, data_parallel=True, grad_hook=sync_dense_grads)

    def loss_curve(self, section: str, build, vocab: int, run: dict, data_parallel: bool, grad_hook=None) -> None:
        """``run["steps"]`` AdamW steps of ``build()`` per curve variant, every loss compared with eager's."""
        tol = run["tol"] if self.dtype == torch.bfloat16 else TOL[torch.float32]
        rows = []
        self.results[section] = {"sizes": self.args.sizes[section], "tol": tol, "variants": rows}
        ref = None
        for name in self.args.curve_variants:
            row = {"variant": name, "label": LABELS[name], "losses": None, "check": "—", "compare": None,
                   "seconds": None, "rewrites": "—", "note": None}
            rows.append(row)
            why = _agree(self.unavailable(name))
            if why is not None:
                row.update(check="n/a", note=f"n/a: {why}")
                self.write()
                continue
            err = None
            try:
                model = build()
                model, info = self.compiled(model, name, section)
                hook = functools.partial(grad_hook, model) if grad_hook else None
                t0 = time.perf_counter()
                losses = train(model, run["steps"], batch=run["batch"], seq_len=run["seq"], vocab=vocab,
                               lr=run["lr"], seed=self.args.seed, device=self.device, data_parallel=data_parallel,
                               grad_hook=hook)
                row["seconds"] = time.perf_counter() - t0
                row["losses"] = losses
                row["rewrites"] = info()[0]
                del model
            except Exception as e:  # noqa: BLE001
                err = self._raised(e)
            err = _agree(err)
            _free(self.device)
            if err is not None:
                self._failed(name, row, err)
            elif name == "eager":
                ref = losses
            elif ref is not None:
                cmp = compare_curves(losses, ref)
                row["compare"] = cmp
                row["check"] = "PASS" if cmp["max_rel_diff"] <= tol else "FAIL"
                self.ok &= row["check"] == "PASS" or name not in OURS
            self.write()

    def serve(self) -> None:
        cfg_kw, run = _split(self.args.sizes["serve"])
        cfg = LlamaConfig(**cfg_kw, seq_len=run["prompt"] + run["new_tokens"])
        cfg.check_tp(self.ws)
        prompts = random_prompts(cfg.vocab_size, run["batch"], run["prompt"], seed=self.args.seed + 7,
                                 device=self.device)
        rows = []
        self.results["serve"] = {"sizes": self.args.sizes["serve"], "variants": rows}
        ref = None
        for name in self.args.variants:
            if name == "async_tp" or (name == "overlap_p2p" and self.device.type == "cpu"):
                continue  # no sequence parallelism, nothing for async-TP to fuse
            row = {"variant": name, "label": LABELS[name], "prefill_ms": None, "decode_ms_per_step": None,
                   "prefill_tokens_per_s": None, "decode_tokens_per_s": None, "tokens_equal": None,
                   "rewrites": "—", "details": {}, "compile_s": None, "note": None}
            rows.append(row)
            why = _agree(self.unavailable(name))
            if why is not None:
                row.update(note=f"n/a: {why}")
                self.write()
                continue
            err = None
            try:
                model = build_llama(cfg, self.mesh, sequence_parallel=False, seed=self.args.seed, device=self.device,
                                    dtype=self.dtype)
                model.setup_cache(run["batch"], cfg.seq_len)
                model, info = self.compiled(model, name, "serve")
                t0 = time.perf_counter()
                first = generate(model, prompts, run["new_tokens"])  # compiles both graphs
                row["compile_s"] = common.allreduce_max([time.perf_counter() - t0], self.device)[0]
                row["rewrites"], row["details"] = info()
                gens = [generate(model, prompts, run["new_tokens"]) for _ in range(run["reps"])]
                del model
            except Exception as e:  # noqa: BLE001
                err = self._raised(e)
            err = _agree(err)
            _free(self.device)
            if err is not None:
                self._failed(name, row, err, check=False)
                self.write()
                continue
            prefill = statistics.median(g.prefill_s for g in gens)
            decode = statistics.median(g.decode_s for g in gens)
            prefill, decode = common.allreduce_max([prefill, decode], self.device)
            steps = max(1, run["new_tokens"] - 1)
            row.update(prefill_ms=prefill * 1e3, decode_ms_per_step=decode * 1e3 / steps,
                       prefill_tokens_per_s=run["batch"] * run["prompt"] / prefill,
                       decode_tokens_per_s=run["batch"] * steps / decode)
            if name == "eager":
                ref = first.tokens
            elif ref is not None:
                row["tokens_equal"] = float((first.tokens == ref).float().mean())
            self.write()

    # ------------------------------------------------------------------ output
    def _raised(self, e: BaseException) -> str:
        """A variant's exception, short (with its traceback printed under ``--verbose``)."""
        if self.args.verbose:
            traceback.print_exc()
        return _short(e)

    def _failed(self, name: str, row: dict, err: str, check: bool = True) -> None:
        """A variant that raised on some rank: ERROR for ours (the run fails), n/a for a baseline."""
        kind = "ERROR" if name in OURS else "n/a"
        row.update(note=f"{kind}: {err}", **({"check": kind} if check else {}))
        self.ok &= name not in OURS

    def write(self) -> None:
        if self.rank != 0:
            return
        stem = self.out_dir / f"models{_mode_tag(self.args.mode)}_ws{self.ws}"
        stem.with_suffix(".md").write_text(self.render())
        common.write_json(stem.with_suffix(".json"), {
            "benchmark": "models", "world_size": self.ws, "dtype": str(self.dtype), "compile": self.args.compile,
            "mode": self.args.mode,
            "tolerance": self.tol, "machine": self.info, "sections": self.results,
        })

    def render(self) -> str:
        a = self.args
        timer = "CUDA events" if self.device.type == "cuda" else "the wall clock (CPU smoke test: times mean nothing)"
        parts = [f"# Real models end to end, world size {self.ws}, {a.dtype}", "",
                 common.info_markdown(self.info), "",
                 f"Compiled {'per transformer block (and the embedding)' if self.per_block('llama') else 'as one graph'}"
                 f"{', mode=' + repr(a.mode) + ' (CUDA graphs)' if a.mode != 'default' else ''}. "
                 f"Times in ms: per-rank median ({timer}, after warm-up), maximum over ranks; "
                 f"`vs X` = X's time / this variant's. Check: the first {a.check_steps} training losses against "
                 f"eager's (relative; tolerance {self.tol:g}).", ""]
        for section in ("llama", "mixtral"):
            if section not in self.results:
                continue
            res = self.results[section]
            rows = res["variants"]
            t = {r["variant"]: r["step_ms"] for r in rows}
            title = {"llama": "Llama, tensor + sequence parallel (DTensor), training step (fwd + bwd + AdamW)",
                     "mixtral": "Mixtral-style MoE, expert parallel (attention data-parallel), training step"}[section]
            parts += [f"## {title}", "", f"Sizes: {res['sizes']}", ""]
            body, notes = [], []
            for r in rows:
                ok = r["check"] in ("PASS", "—", "n/a (bound)") and r["step_ms"] is not None
                chk = r["check"] + (f" ({r['max_rel_loss_diff']:.1e})" if r["max_rel_loss_diff"] is not None else "")
                body.append([r["label"], common.fmt_ms(r["step_ms"]), common.fmt_ms(r["fwd_bwd_ms"]),
                             f"{r['tokens_per_s']:.0f}" if r["tokens_per_s"] else "—",
                             _ratio(t.get("eager"), r["step_ms"]) if ok else "—",
                             _ratio(t.get("inductor"), r["step_ms"]) if ok else "—",
                             _ratio(t.get("async_tp"), r["step_ms"]) if ok and section == "llama" else "—",
                             chk, r["rewrites"],
                             "—" if r["compile_s"] is None else f"{r['compile_s']:.1f}",
                             "—" if r["step_mem_gib"] is None else f"{r['step_mem_gib']:.1f}"])
                if r["note"]:
                    notes.append(f"- {r['label']}: {r['note']}")
            headers = ["variant", "step ms", "fwd+bwd ms", "tokens/s", "vs eager", "vs Inductor", "vs async-TP",
                       "check", "rewrites / fused ops", "compile + check s", "step mem GiB"]
            parts += [common.markdown_table(headers, body), ""]
            ours, ind, atp = t.get("overlap"), t.get("inductor"), t.get("async_tp")
            if ours and ind:
                line = f"overlap vs Inductor: {ind / ours:.3f}×"
                if section == "llama":
                    line += f" (bar ≥ {BAR_VS_INDUCTOR})"
                    if atp:
                        line += f"; vs Inductor + async-TP: {atp / ours:.3f}× (bar ≥ {BAR_VS_ASYNC_TP})"
                else:
                    line += f" (never slower than Inductor by > 2 %: {'yes' if ind / ours >= MAX_SLOWDOWN else 'NO'})"
                parts += [line, ""]
            free = t.get("inductor_nocomm")
            if free and ind:
                parts += [f"Inductor with free communication (collectives replaced by local copies, a bound): "
                          f"{free:.3f} ms, {ind / free:.3f}× Inductor: the most that overlapping all communication "
                          f"could gain on this step{f' (overlap has {ind / ours:.3f}×)' if ours else ''}.", ""]
            parts += notes + ([""] if notes else [])
        for section, title in (("curve", "Llama TP + SP training"), ("mixtral_curve", "Mixtral EP training")):
            if section not in self.results:
                continue
            res = self.results[section]
            parts += [f"## Loss curve, {title}, every step vs eager", "",
                      f"Sizes: {res['sizes']}; PASS if the max relative difference to eager's loss <= {res['tol']:g}. "
                      "Every loss is in the JSON.", ""]
            body = []
            for r in res["variants"]:
                c = r["compare"]
                ls = r["losses"]
                body.append([r["label"], len(ls) if ls else "—", f"{ls[0]:.4f}" if ls else "—",
                             f"{ls[-1]:.4f}" if ls else "—",
                             f"{c['max_rel_diff']:.2e} (step {c['argmax']})" if c else "—",
                             f"{c['mean_rel_diff']:.2e}" if c else "—", r["check"],
                             f"{r['seconds']:.1f}" if r["seconds"] else "—", r.get("rewrites", "—")])
            parts += [common.markdown_table(["variant", "steps", "first loss", "last loss", "max rel diff vs eager",
                                             "mean rel diff", "check", "run s (compile incl.)", "rewrites"], body), ""]
            parts += [f"- {r['label']}: {r['note']}" for r in res["variants"] if r["note"]] + [""]
        if "serve" in self.results:
            res = self.results["serve"]
            rows = res["variants"]
            pre = {r["variant"]: r["prefill_ms"] for r in rows}
            dec = {r["variant"]: r["decode_ms_per_step"] for r in rows}
            parts += ["## Serving, Llama tensor parallel (no SP), prefill + greedy decode with static KV caches", "",
                      f"Sizes: {res['sizes']}. Wall clock with device synchronisation, median of `reps` generations "
                      "after a warm-up one, max over ranks. tokens equal: share of the greedy tokens equal to eager's.",
                      ""]
            body = []
            for r in rows:
                body.append([r["label"], common.fmt_ms(r["prefill_ms"]),
                             f"{r['prefill_tokens_per_s']:.0f}" if r["prefill_tokens_per_s"] else "—",
                             common.fmt_ms(r["decode_ms_per_step"]),
                             f"{r['decode_tokens_per_s']:.0f}" if r["decode_tokens_per_s"] else "—",
                             _ratio(pre.get("inductor"), r["prefill_ms"]), _ratio(dec.get("inductor"), r["decode_ms_per_step"]),
                             "—" if r["tokens_equal"] is None else f"{100 * r['tokens_equal']:.0f} %",
                             r["rewrites"], "—" if r["compile_s"] is None else f"{r['compile_s']:.1f}"])
            parts += [common.markdown_table(["variant", "prefill ms", "prefill tok/s", "decode ms/step", "decode tok/s",
                                             "prefill vs Inductor", "decode vs Inductor", "tokens equal", "rewrites",
                                             "first generation s"], body), ""]
            parts += [f"- {r['label']}: {r['note']}" for r in rows if r["note"]] + [""]
        return "\n".join(parts)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_models: CUDA is not available (use the device machine, or --device cpu)", file=sys.stderr)
        return 2
    rank, ws, device = common.init_distributed(args.device)
    if device.type == "cpu":
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    out_dir = Path(args.out)
    if rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
    info = common.machine_info(device, ws)
    info.update(quick=args.quick, lowerings_registered=list(overlap_backend.runtime.available()),
                overlap_env={k: v for k, v in os.environ.items() if k.startswith("OVERLAP_")})
    bench = Bench(args, ws, device, info, out_dir)
    try:
        for section in args.sections:
            torch._dynamo.reset()  # other shapes: a fresh start, not automatic dynamic shapes
            t0 = time.perf_counter()
            getattr(bench, section)()
            common.synchronize(device)
            dist.barrier()
            if rank == 0:
                print(f"bench_models: {section} done in {time.perf_counter() - t0:.1f} s", flush=True)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        print((out_dir / f"models{_mode_tag(args.mode)}_ws{ws}.md").read_text(), flush=True)
        print("bench_models: all checks of the overlap variants PASS (or n/a)" if bench.ok
              else "bench_models: a check of an overlap variant FAILED or it raised", flush=True)
    return 0 if bench.ok else 1


if __name__ == "__main__":
    common.exit_now(main())
