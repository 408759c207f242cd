"""Kernel benchmark of record (one GPU, no communication): every GEMM kernel the overlap ops run, alone,
against cuBLAS on the same local GEMM.

    python bench/suites/bench_kernels.py --out bench/results/kernels_h200x1_<date> [--quick] [--dry-run]
        [--kernels ag_mm,mm_rs,mm_ar,oneshot,cta_stage0,cta_stage1,cta_stage0_cublas,cta_stage1_cublas,
                   moe_gate_up,moe_down,moe_grouped_mm,ag_mm_cublas,mm_rs_cublas,mm_ar_cublas] [--ws 2,4,8]
        [--budget-s 300] [--jobs N] [--reps 30] [--no-variants]

Kernels (``codegen/``): the ``ag_mm`` consumer, the ``mm_rs`` producer, the same kernel as ``mm_ar``'s
rounds (``WRITE_GATHER``), the one-shot all-reduce sum, the CTA op's stage-0 / stage-1 kernels and the
MoE grouped GEMMs (gate/up with SwiGLU fused, down); the cuBLAS paths the collective GEMMs take where their
kernels lose (``runtime/symm``'s ``ag_mm_cublas``, ``mm_rs_cublas``, ``mm_ar_cublas`` on ``AloneGroup``: a GEMM
per chunk or band, the flag writes and waits, the partials' sum; no transfers); and the CTA stages' cuBLAS forms
(``runtime/cta_cublas.py``: a GEMM per row group and K-chunk into the staged blocks, the activation a
separate pass; stage 1's accumulating ``addmm`` per arrived block) and the MoE experts' ``torch._grouped_mm``
form (``runtime/moe_grouped.py``: per segment, gather, both grouped GEMMs with SwiGLU between, scatter; against
the two grouped GEMMs on rows already sorted), with their flag steps left out. Each runs as rank 0 of a
``ws``-rank group with every flag raised (epoch 0) and the peers' data already local, at the local shapes of the 2-, 4- and
8-GPU tables of every suite (collective GEMMs, TP block, Llama, MoE DeepSeek-/Mixtral-like, CTA MLP)
and at decode sizes, deduplicated (``cases``). Per case: the op's tuning candidates
(``codegen.configs.candidates``, what the op's tuner picks from) and the bench-only variants
(``knobs.codegen.VARIANTS_16BIT``: store variants, other stages / GROUP_M), each checked against a
float32 reference on random inputs with its outputs NaN-poisoned first, then timed: GPU time, CUDA events
around each call after warm-up, median of ``--reps``, the calls enqueued behind a GPU spin so that none
waits for its launch (``common.queued_ms``: the host's launch time, recorded beside it, is not in it, as
in the ops' CUDA graphs); the op's best config and the baseline also back to back, events only, where a
launch that takes longer than its kernel shows. Baselines: ``torch.mm`` / ``torch._grouped_mm`` on the same GEMM; with
a fused epilogue, cuBLAS plus torch's separate pointwise op (the stand-in for Inductor's pointwise
kernel, labelled so in the table), timed before and after the case's configs, the faster run kept; the one-shot
sum against ``torch.sum`` over the partials.

Outputs in ``--out``: ``table.md`` (the table of record), ``results.json`` (every config's time and
error), ``kernel_ratios.json`` (the format of ``overlap_backend/spec/kernel_ratios.py``: copy it over
``overlap_backend/spec/kernel_ratios.json`` and the ops take cuBLAS where the kernel measured slower than
``knobs.symm.CUBLAS_ABOVE_RATIO``), ``variants.md`` (which variants beat the op's candidates),
``README.md`` (machine, versions, the exact command). Cold Triton caches: the kernel variants are
compiled first by ``--jobs`` worker processes (``launcher.preloading``), then timed in this one; the
run stops starting cases after ``--budget-s`` seconds and lists those it left out. ``--dry-run`` (no
GPU) builds the case list and writes every output with made-up timings, to check the script.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.tools import common  # noqa: E402

KERNELS = ("ag_mm", "mm_rs", "mm_ar", "oneshot", "cta_stage0", "cta_stage1", "cta_stage0_cublas", "cta_stage1_cublas",
           "moe_gate_up", "moe_down", "moe_grouped_mm", "ag_mm_cublas", "mm_rs_cublas", "mm_ar_cublas")
# The ops' cuBLAS forms (no Triton kernel to compile): the op's own steps, timed as its kernels are.
CUBLAS_FORMS = ("cta_stage0_cublas", "cta_stage1_cublas", "moe_grouped_mm", "ag_mm_cublas", "mm_rs_cublas",
                "mm_ar_cublas")
WORLD_SIZES = (2, 4, 8)
# Global problems of the collective-GEMM suite (bench_collective_gemm.TABLE / DECODE, ws-independent):
AG_MM = [(4096, 8192, 7168), (8192, 8192, 7168), (16384, 8192, 2048), (8192, 8192, 14336), (512, 8192, 7168)]
MM_RS = [(4096, 7168, 8192), (8192, 7168, 8192), (16384, 2048, 8192), (512, 7168, 8192)]  # K split ws ways
MM_AR = [(128, 7168, 8192), (1024, 7168, 8192), (4096, 7168, 8192), (8192, 7168, 8192)]  # per rank
# The TP block (bench_block: batch 4 x seq 2048 tokens, hidden 4096, 32 heads, ffn 14336) and Llama
# (bench_models: dim 4096, 8 KV heads of 128, ffn 14336, batch 4 x seq 2048), serving decode: 8 tokens.
TOKENS, HIDDEN, FFN, KV = 8192, 4096, 14336, 1024
CTA_H, CTA_F, CTA_M = 8192, 28672, (16, 128, 512, 1024, 4096)  # bench_cta defaults
MOE = {"mixtral": (4096, 14336, 8, 2, 4096), "deepseek": (7168, 2048, 32, 8, 4096),  # bench_moe.CONFIGS
       "mixtral-decode": (4096, 14336, 8, 2, 128), "deepseek-decode": (7168, 2048, 32, 8, 128),
       "deepseek-ep8": (7168, 2048, 64, 8, 4096)}
CHECK_TOL = 1e-2  # bf16 against float32


@dataclasses.dataclass(frozen=True)
class Case:
    """One kernel at one local GEMM ``M x K x N`` as rank 0 of ``ws`` (``moe``: the MoE config)."""

    kernel: str
    ws: int
    M: int
    K: int
    N: int
    epilogue: str = ""  # fused: "gelu" (ag_mm, after its bias), "add:0" (mm_rs's residual), stage 0's GELU, MoE's SwiGLU
    moe: str = ""

    @property
    def fused(self) -> bool:
        return bool(self.epilogue)

    def label(self) -> str:
        return f"{self.kernel} ws={self.ws} {self.M}x{self.K}x{self.N}" + (f" +{self.epilogue}" if self.epilogue else "") + (
            f" [{self.moe}]" if self.moe else "")


def cases(quick: bool = False, kernels=KERNELS, world_sizes=WORLD_SIZES) -> list[tuple[Case, list[str]]]:
    """Every (case, suites it stands for), deduplicated, in a stable order."""
    found: dict[Case, list[str]] = {}

    def add(case: Case, origin: str) -> None:
        if case.kernel in kernels and case.ws in world_sizes:
            found.setdefault(case, [])
            if origin not in found[case]:
                found[case].append(origin)

    for ws in world_sizes:
        tp = ws // 2
        for kernel in ("ag_mm", "ag_mm_cublas"):  # (the cuBLAS form: plain GEMMs; an epilogue fuses into the kernel)
            for M, K, N in AG_MM:
                add(Case(kernel, ws, M, K, N), "collective ag_mm" + (" decode" if M == 512 else ""))
            add(Case(kernel, ws, TOKENS, HIDDEN, 3 * HIDDEN // ws), "TP block qkv")
            add(Case(kernel, ws, TOKENS, HIDDEN, FFN // ws), "TP block fc1 / Llama w1, w3")
            add(Case(kernel, ws, TOKENS, HIDDEN, (HIDDEN + 2 * KV) // ws), "Llama qkv")
        add(Case("ag_mm", ws, TOKENS, HIDDEN, FFN // ws, "gelu"), "TP block fc1 + bias, GELU")
        for kernel in ("mm_rs", "mm_rs_cublas"):
            for M, K, N in MM_RS:
                add(Case(kernel, ws, M, K // ws, N), "collective mm_rs" + (" decode" if M == 512 else ""))
            add(Case(kernel, ws, TOKENS, HIDDEN // ws, HIDDEN), "TP block out-proj / Llama wo")
            add(Case(kernel, ws, TOKENS, FFN // ws, HIDDEN), "TP block fc2 / Llama w2")
            add(Case(kernel, ws, TOKENS, FFN // ws, HIDDEN, "add:0"), "TP block fc2 + residual")
            add(Case(kernel, ws, TOKENS, (HIDDEN + 2 * KV) // ws, HIDDEN), "Llama qkv input grad")
            add(Case(kernel, ws, TOKENS, 2 * FFN // ws, HIDDEN), "Llama w1/w3 input grad")
        for M, K, N in MM_AR:
            if M * N * 2 <= 4 << 20:  # knobs.symm.ONESHOT_MAX_BYTES: torch.mm then the one-shot sum
                add(Case("oneshot", ws, M, 1, N), "collective mm_ar (one-shot)")
            else:
                add(Case("mm_ar", ws, M, K, N), "collective mm_ar")
                add(Case("mm_ar_cublas", ws, M, K, N), "collective mm_ar")
        add(Case("oneshot", ws, 8, 1, HIDDEN), "Llama serving decode (one-shot)")
        if tp:
            for M in CTA_M:
                add(Case("cta_stage0", ws, M, CTA_H, CTA_F // tp, "gelu_tanh"), "CTA MLP stage 0")
                add(Case("cta_stage1", ws, M, CTA_F, CTA_H // tp), "CTA MLP stage 1")
                add(Case("cta_stage0_cublas", ws, M, CTA_H, CTA_F // tp, "gelu_tanh"), "CTA MLP stage 0")
                add(Case("cta_stage1_cublas", ws, M, CTA_F, CTA_H // tp), "CTA MLP stage 1")
        for name, (h, f, experts, k, tokens) in MOE.items():
            if experts % ws or (name == "deepseek-ep8" and ws != 8):
                continue
            add(Case("moe_gate_up", ws, tokens * k, h, f, "swiglu", name), f"MoE {name}")
            add(Case("moe_down", ws, tokens * k, f, h, "", name), f"MoE {name}")
            add(Case("moe_grouped_mm", ws, tokens * k, h, f, "swiglu", name), f"MoE {name}")
    # the GEMMs the ops choose cuBLAS for first, 4 GPUs first: what a time box cuts is the least needed
    order = {4: 0, 2: 1, 8: 2}
    out = sorted(found.items(), key=lambda item: (KERNELS.index(item[0].kernel), order[item[0].ws]))
    if quick:
        keep = {Case("ag_mm", 4, 8192, 8192, 7168), Case("ag_mm", 4, TOKENS, HIDDEN, FFN // 4, "gelu"),
                Case("mm_rs", 4, 4096, 1792, 8192), Case("mm_rs", 4, TOKENS, FFN // 4, HIDDEN, "add:0"),
                Case("mm_ar", 4, 1024, 7168, 8192), Case("oneshot", 4, 128, 1, 8192),
                Case("cta_stage0", 4, 1024, CTA_H, CTA_F // 2, "gelu_tanh"), Case("cta_stage1", 4, 1024, CTA_F, CTA_H // 2),
                Case("cta_stage0_cublas", 4, 1024, CTA_H, CTA_F // 2, "gelu_tanh"),
                Case("cta_stage1_cublas", 4, 1024, CTA_F, CTA_H // 2),
                Case("moe_gate_up", 4, 32768, 7168, 2048, "swiglu", "deepseek"),
                Case("moe_down", 4, 32768, 2048, 7168, "", "deepseek"),
                Case("moe_grouped_mm", 4, 32768, 7168, 2048, "swiglu", "deepseek"),
                Case("ag_mm_cublas", 4, 8192, 8192, 7168), Case("mm_rs_cublas", 4, 4096, 1792, 8192),
                Case("mm_ar_cublas", 4, 1024, 7168, 8192)}
        out = [(c, o) for c, o in out if c in keep]
    return out


# ----------------------------------------------------------------------------------------- one case
class AloneGroup:
    """The ``GroupState`` the collective GEMMs' cuBLAS forms (``runtime/symm``) see here: rank 0 of ``ws`` on
    this one device, every flag already raised (the forms' stream waits pass at once), pushes dropped (no
    communication); the flag writes and waits are the real stream memory operations, on local words; the copy
    stream is a stream of its own that the call's end joins, as the op's. A call as the op makes it under its
    private CUDA graphs (``graph``: the captured protocol's banding and flag block) on a GPU."""

    EPOCH = 1
    rank = 0
    fast = False

    def __init__(self, ws: int, dev):
        from overlap_backend.spec import symm_layout

        self.ws, self.device = ws, dev
        self.graph = dev.type == "cuda"
        self.base = symm_layout.GRAPH_BLOCK if self.graph else 0
        self.flags = torch.full((symm_layout.FLAG_WORDS,), 1 << 30, dtype=torch.int32, device=dev)
        self.data = torch.empty(0, dtype=torch.uint8, device=dev)
        self.copy_stream = torch.cuda.Stream(dev) if self.graph else None

    def compute(self):
        return torch.cuda.current_stream(self.device)

    def begin(self, compute, what: str = "", graph: bool = False) -> int:
        return self.EPOCH

    def end(self, compute) -> None:
        if self.copy_stream is not None:
            compute.wait_stream(self.copy_stream)

    def flag_addr(self, index: int, rank: int | None = None) -> int:
        return self.flags.data_ptr() + 4 * index

    def stream_wait(self, word: int, value: int, stream, nbands: int = 1) -> None:
        from overlap_backend.runtime import cuda as _cuda

        _cuda.wait_value32(self.flag_addr(word), value, stream)

    def push_stream_to(self, peer: int):
        return self.compute()

    def push(self, *args, **kwargs) -> None:
        pass

    def ensure_data(self, nbytes: int, op: str = "") -> None:
        if self.data.numel() < nbytes:
            self.data = torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def data_view(self, dtype, shape, offset_bytes: int = 0):
        n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        return self.data[offset_bytes:offset_bytes + n].view(dtype).view(*shape)

    def data_addr(self, rank: int, offset_bytes: int) -> int:
        return self.data.data_ptr() + offset_bytes


class Bench:
    """A case's tensors, references and baseline; ``run(cfg)`` launches the kernel in one config."""

    def __init__(self, case: Case, dev, num_sms: int, reps: int, dtype=torch.bfloat16):
        self.case, self.dev, self.num_sms, self.reps = case, dev, num_sms, reps
        self.dt = dtype  # (float32: the CPU interpreter's test, tests/bench/test_bench_kernels.py)
        self.fresh_outputs: list[tuple[int, ...]] = []  # (see check)
        getattr(self, "_setup_" + case.kernel)()

    # ---- helpers
    def _rand(self, *shape, scale=1.0):
        return (torch.randn(*shape, device=self.dev) * scale).to(self.dt)

    def _status(self):
        return (torch.zeros(1, dtype=torch.int32, device=self.dev), torch.zeros(8, dtype=torch.int32, device=self.dev))

    def _gemm_operands(self):
        c = self.case
        self.a = self._rand(c.M, c.K)
        self.b = self._rand(c.K, c.N, scale=c.K ** -0.5)
        self.ref = self.a.float() @ self.b.float()

    # ---- ag_mm consumer
    def _setup_ag_mm(self):
        from overlap_backend.codegen import ag_mm, configs
        from overlap_backend.codegen import epilogue as gen
        from overlap_backend.spec import symm_layout

        c = self.case
        self._gemm_operands()
        rows = c.M // c.ws
        self.shard, self.buf = self.a[:rows].contiguous(), self.a.view(c.ws, rows, c.K)
        self.band = symm_layout.band_rows(rows)
        self.flags = torch.zeros(c.ws * -(-rows // self.band), dtype=torch.int32, device=self.dev)
        self.status = self._status()
        self.out = torch.empty(c.M, c.N, device=self.dev, dtype=self.dt)
        self.bias = self._rand(c.N) if c.fused else None
        self.gen = gen.build(c.epilogue, self.dt) if c.fused else None
        self.want = F.gelu(self.ref + self.bias.float()) if c.fused else self.ref
        self.outputs = [self.out]
        a, b, bias = self.a, self.b, self.bias
        if c.fused:
            self.baseline = ("cuBLAS addmm + torch F.gelu (Inductor pointwise proxy)", lambda: F.gelu(torch.addmm(bias, a, b)))
        else:
            self.baseline = ("cuBLAS torch.mm", lambda: torch.mm(a, b))
        self.op_cands = configs.candidates(self.dt, tma_store_rows=rows, variants=False, kernel="ag_mm")
        self.variant_cands = configs.variant_candidates(self.dt, "ag_mm", tma_store_rows=rows)
        ptrs = gen.pointers(self.gen, ()) if self.gen is not None else ()

        def run(cfg):
            ag_mm.launch(self.shard, self.buf, self.b, self.bias, self.out, self.flags, 0, self.status, 10**9, 0, c.ws,
                         rows, self.band, cfg, self.num_sms, epilogue=self.gen, ep_ptrs=ptrs)

        self.run = run
        self.error = lambda: common.rel_err(self.out.float(), self.want)

    # ---- mm_rs producer (and its mm_ar rounds form)
    def _rs_buffers(self, rows, rounds):
        from overlap_backend.spec import symm_layout

        c = self.case
        self.band = symm_layout.band_rows(rows)
        nb = -(-rows // self.band)
        self.flags = [torch.zeros(rounds * c.ws * nb, dtype=torch.int32, device=self.dev) for _ in range(3)]
        self.ticket = torch.zeros(1, dtype=torch.int32, device=self.dev)
        self.status = self._status()
        self.recv = self._rand(rounds * c.ws * rows, c.N)  # the peers' partials of this rank's chunks
        self.stage = torch.empty(rounds * c.ws * rows, c.N, device=self.dev, dtype=self.dt)

    def _mm_rs_problem(self, rows):
        """Rank 0's reduce-scatter of its [M, K] @ [K, N] (its own chunk: rows [0, rows)): the peers' partials
        of it in ``self.recv`` slots 1.., the reference, the baseline, the fused residual and epilogue."""
        from overlap_backend.codegen import epilogue as gen

        c = self.case
        self._gemm_operands()
        self._rs_buffers(rows, 1)
        self.out = torch.empty(rows, c.N, device=self.dev, dtype=self.dt)
        own = self.ref[:rows] + sum(self.recv[p * rows:(p + 1) * rows].float() for p in range(1, c.ws))
        self.residual = self._rand(rows, c.N) if c.fused else None
        self.want = own.to(self.dt).float() + self.residual.float() if c.fused else own
        self.gen = gen.build(c.epilogue, self.dt) if c.fused else None
        a, b, res = self.a, self.b, self.residual
        if c.fused:
            summed = torch.empty(rows, c.N, device=self.dev, dtype=self.dt)
            self.baseline = ("cuBLAS torch.mm + torch.add (Inductor pointwise proxy)",
                             lambda: torch.add(torch.mm(a, b)[:rows], res, out=summed))
        else:
            self.baseline = ("cuBLAS torch.mm", lambda: torch.mm(a, b))

    def _setup_mm_rs(self):
        from overlap_backend.codegen import configs, mm_rs
        from overlap_backend.codegen import epilogue as gen

        c = self.case
        rows = c.M // c.ws
        self._mm_rs_problem(rows)
        ptrs = gen.pointers(self.gen, [self.residual]) if c.fused else ()
        self.outputs = [self.out, self.stage]
        self.op_cands = configs.candidates(self.dt, None, tma_store_rows=rows, variants=False, kernel="mm_rs")
        self.variant_cands = configs.variant_candidates(self.dt, "mm_rs", tma_store_rows=rows)

        def run(cfg):
            mm_rs.launch(self.a, self.b, None, self.stage, self.recv, None, self.out, *self.flags, self.ticket, 0,
                         self.status, 10**9, 0, c.ws, rows, rows, 1, 0, 0, False, self.band, cfg, self.num_sms,
                         epilogue=self.gen, ep_ptrs=ptrs)

        self.run = run

        def error():
            err = common.rel_err(self.out.float(), self.want)
            if c.ws > 1:  # what this rank ships: its partials of the peers' chunks
                err = max(err, common.rel_err(self.stage[rows:].float(), self.ref[rows:]))
            return err

        self.error = error

    def _setup_mm_ar(self):
        from overlap_backend.codegen import configs, mm_rs
        from overlap_backend.runtime.symm.mm_ar import ar_rounds

        c = self.case
        self._gemm_operands()
        rounds = ar_rounds(c.M, c.ws)
        rows = -(-c.M // (rounds * c.ws))
        self._rs_buffers(rows, rounds)
        self.gather = torch.empty(rounds * c.ws * rows, c.N, device=self.dev, dtype=self.dt)
        self.out = torch.empty(c.M, c.N, device=self.dev, dtype=self.dt)
        self.outputs = [self.out, self.gather, self.stage]
        a, b = self.a, self.b
        self.baseline = ("cuBLAS torch.mm", lambda: torch.mm(a, b))
        self.op_cands = configs.candidates(self.dt, variants=False, kernel="mm_rs")
        self.variant_cands = configs.variant_candidates(self.dt, "mm_rs")  # (no TMA variant: rounds)

        def run(cfg):
            mm_rs.launch(self.a, self.b, None, self.stage, self.recv, self.gather, self.out, *self.flags, self.ticket,
                         0, self.status, 10**9, 0, c.ws, rows, rows, rounds, c.ws * rows, 0, False, self.band, cfg,
                         self.num_sms)

        self.run = run
        own = [(t * c.ws * rows, min(rows, c.M - t * c.ws * rows)) for t in range(rounds)]

        def error():
            errs = []
            for t, (lo, n) in enumerate(own):
                if n <= 0:
                    continue
                want = self.ref[lo:lo + n] + sum(self.recv[(t * c.ws + p) * rows:(t * c.ws + p) * rows + n].float()
                                                 for p in range(1, c.ws))
                errs.append(common.rel_err(self.out[lo:lo + n].float(), want))
                errs.append(common.rel_err(self.gather[t * c.ws * rows:t * c.ws * rows + n].float(), want))
            return max(errs)

        self.error = error

    # ---- the collective GEMMs' cuBLAS forms (runtime/symm: the op's own code on an AloneGroup)
    def _setup_ag_mm_cublas(self):
        from overlap_backend.runtime.symm import ag_mm as symm_ag_mm

        c = self.case
        self._gemm_operands()
        rows = c.M // c.ws
        shard, buf = self.a[:rows].contiguous(), self.a.view(c.ws, rows, c.K)
        out = torch.empty(c.M, c.N, device=self.dev, dtype=self.dt)
        st = AloneGroup(c.ws, self.dev)
        self.want, self.outputs = self.ref, [out]
        a, b = self.a, self.b
        self.baseline = ("cuBLAS torch.mm", lambda: torch.mm(a, b))
        self.op_cands, self.variant_cands = [None], []
        # whole chunks (one flag per peer: the cuBLAS path's push), the call's compute on the current stream
        self.run = lambda cfg: symm_ag_mm.ag_mm_cublas(st, shard, buf, [b], [None], [out], 1, rows, st.EPOCH, st.base,
                                                       1, st.compute())
        self.error = lambda: common.rel_err(out.float(), self.want)

    def _setup_mm_rs_cublas(self):
        from overlap_backend.runtime.symm import mm_rs as symm_mm_rs

        c = self.case
        rows = c.M // c.ws
        self._mm_rs_problem(rows)
        st = AloneGroup(c.ws, self.dev)
        self.outputs = []
        self.fresh_outputs = [(rows, c.N)]  # the reduced chunk the form returns
        self.op_cands, self.variant_cands = [None], []
        got = {}
        args = [self.residual] if c.fused else []

        def run(cfg):
            got["out"] = symm_mm_rs.mm_rs_cublas(st, self.a, self.b, None, self.recv[:c.ws * rows], 1, rows, False,
                                                 st.graph, self.gen, args)

        self.run = run
        self.error = lambda: common.rel_err(got["out"].float(), self.want)

    def _setup_mm_ar_cublas(self):
        from overlap_backend.runtime.symm import mm_ar as symm_mm_ar

        c = self.case
        self._gemm_operands()
        st = AloneGroup(c.ws, self.dev)
        rounds = symm_mm_ar.ar_cublas_rounds(c.M, c.K, c.N, c.ws)
        rows = -(-c.M // (rounds * c.ws))
        st.ensure_data(2 * rounds * c.ws * rows * c.N * self.a.element_size())
        recv = st.data_view(self.dt, (rounds, c.ws, rows, c.N))
        recv.copy_(self._rand(rounds, c.ws, rows, c.N))  # the peers' partials of this rank's chunks (slots 1..)
        a, b = self.a, self.b
        self.baseline = ("cuBLAS torch.mm", lambda: torch.mm(a, b))
        self.op_cands, self.variant_cands = [None], []
        self.outputs = []
        self.fresh_outputs = [(c.M, c.N)] * (2 if rounds * c.ws * rows == c.M else 1)  # out (and stage, same size)
        got = {}

        def run(cfg):
            got["out"] = symm_mm_ar.mm_ar_cublas(st, a, b, None, False, st.graph)

        self.run = run

        def error():  # this rank's reduced chunk of every round (the peers' come from the gather region)
            errs = []
            for t in range(rounds):
                lo = t * c.ws * rows
                n = max(0, min(rows, c.M - lo))
                if n:
                    want = self.ref[lo:lo + n] + recv[t, 1:, :n].float().sum(0)
                    errs.append(common.rel_err(got["out"][lo:lo + n].float(), want))
            return max(errs)

        self.error = error

    # ---- one-shot all-reduce sum
    def _setup_oneshot(self):
        from overlap_backend.codegen import reduce

        c = self.case
        self.recv = self._rand(c.ws, c.M, c.N)
        own = self.recv[0]
        self.flags = torch.zeros(c.ws, dtype=torch.int32, device=self.dev)
        self.status = self._status()
        self.out = torch.empty(c.M, c.N, device=self.dev, dtype=self.dt)
        self.want = self.recv.float().sum(0)
        self.outputs = [self.out]
        summed = torch.empty(c.M, c.N, device=self.dev, dtype=self.dt)
        self.baseline = ("torch.sum over the ws partials", lambda: torch.sum(self.recv, 0, out=summed))
        self.op_cands, self.variant_cands = [None], []

        def run(cfg):
            reduce.launch(own, self.recv, self.out, self.flags, 0, self.status, 10**9, 0, c.ws, False)

        self.run = run
        self.error = lambda: common.rel_err(self.out.float(), self.want)

    # ---- CTA stage kernels
    def _cta_plan(self, M, fp, ns):
        from overlap_backend.runtime import cta_plan

        tp = self.case.ws // 2
        cfg0, cfg1 = cta_plan.block_configs(self.dt, False, M, ns, self.num_sms)
        kchunk, nch = cta_plan.k_chunks(fp, cfg0[1], cfg1[2], -(-(-(-M // cfg0[0])) // cfg0[3]), tp)
        return cfg0, cfg1, kchunk, nch

    def _chunk_major(self, tp, fp, kchunk, nch, mp):
        """Stage 1's input as the stage-0 ranks ship it: [tp * nch, mp, kchunk] blocks of ``self.a``'s columns."""
        blocks = torch.zeros(tp * nch, mp, kchunk, device=self.dev, dtype=self.dt)
        for p in range(tp):
            for j in range(nch):
                lo, w = p * fp + j * kchunk, min(kchunk, fp - j * kchunk)
                blocks[p * nch + j, :self.case.M, :w] = self.a[:, lo:lo + w]
        return blocks

    def _setup_cta_stage0(self):
        from overlap_backend.codegen import cta
        from overlap_backend.runtime import cta_plan
        from overlap_backend.spec import knobs

        c = self.case
        self._gemm_operands()
        cfg0, _, kchunk, nch = self._cta_plan(c.M, c.N, CTA_H // (c.ws // 2))
        mp = cta.padded_rows(c.M, cfg0[0])
        self.stage = torch.empty(nch * mp * kchunk, device=self.dev, dtype=self.dt)
        self.counters = torch.zeros(4096, dtype=torch.int32, device=self.dev)
        self.done = torch.zeros(4096, dtype=torch.int32, device=self.dev)
        self.epoch = torch.ones(1, dtype=torch.int32, device=self.dev)
        tables = torch.zeros(8, dtype=torch.int64, device=self.dev)
        self.want = F.gelu(self.ref, approximate="tanh")
        self.outputs = [self.stage]
        a, b = self.a, self.b
        self.baseline = ("cuBLAS torch.mm + torch F.gelu tanh (Inductor pointwise proxy)",
                         lambda: F.gelu(torch.mm(a, b), approximate="tanh"))
        # the op's config and split-K runs (cta_plan, no tuning), pointer and TMA stores of the staged tiles, then
        # bench-only variants (narrower tiles: more of them where few rows leave SMs idle)
        def split(cfg):
            return cta_plan.split_runs(-(-c.M // cfg[0]) * -(-c.N // cfg[1]), -(-c.K // cfg[2]), self.num_sms,
                                       knobs.cta.STAGE0_SPLIT_K)

        self.op_cands = [(*cfg0, False, split(cfg0)), (*cfg0, True, split(cfg0))]
        narrow = [(cfg0[0], bn, cfg0[2], cfg0[3], stages, warps) for bn, stages, warps in ((128, 4, 8), (64, 4, 4))
                  if bn < cfg0[1]]
        runs = split(cfg0)  # variants: no split, half the runs (a shorter sum, longer runs), narrower tiles
        self.variant_cands = [(*cfg0, True, r) for r in sorted({1, runs // 2} - {0, runs})]
        self.variant_cands += [(*cfg, True, split(cfg)) for cfg in narrow]
        self.partials = torch.empty(max(cta.split_partials_numel(c.M, c.N, cfg, cfg[7])
                                        for cfg in self.op_cands + self.variant_cands), device=self.dev)
        self.split_counters = torch.zeros(4096, dtype=torch.int32, device=self.dev)

        def run(cfg):
            cta.launch_stage0(a, b, None, None, None, self.stage, tables, tables, self.counters, self.done, self.epoch,
                              0, kchunk, nch, 0, 1, 1, cta.ACT_GELU_TANH, cfg[:6], self.num_sms, tma_store=cfg[6],
                              split_k=cfg[7], split_partials=self.partials, split_counters=self.split_counters)

        self.run = run
        self.error = lambda: common.rel_err(
            self.stage.view(nch, mp, kchunk)[:, :c.M].permute(1, 0, 2).reshape(c.M, nch * kchunk)[:, :c.N].float(),
            self.want)

    def _setup_cta_stage1(self):
        from overlap_backend.codegen import cta
        from overlap_backend.runtime import cta_plan
        from overlap_backend.spec import knobs

        c = self.case
        tp = c.ws // 2
        fp = c.K // tp
        self._gemm_operands()
        _, cfg1, kchunk, nch = self._cta_plan(c.M, fp, c.N)
        mp = cta.padded_rows(c.M, cfg1[0])
        self.blocks = self._chunk_major(tp, fp, kchunk, nch, mp).view(tp * nch * mp, kchunk)
        self.out = torch.empty(c.M, c.N, device=self.dev, dtype=self.dt)
        tiles_m = -(-c.M // cfg1[0])
        self.flags = torch.zeros(4096, dtype=torch.int32, device=self.dev)
        self.counters = torch.zeros(max(tiles_m, 1), dtype=torch.int32, device=self.dev)
        self.epoch = torch.zeros(1, dtype=torch.int32, device=self.dev)
        tables = torch.zeros(8, dtype=torch.int64, device=self.dev)
        self.status = self._status()
        self.want = self.ref
        self.outputs = [self.out]
        a, b = self.a, self.b
        self.baseline = ("cuBLAS torch.mm", lambda: torch.mm(a, b))
        # the op's config and split-K runs (cta_plan), then bench-only variants
        def split(cfg):
            return cta_plan.split_runs(tiles_m * -(-c.N // cfg[1]), tp * nch, self.num_sms, knobs.cta.STAGE1_SPLIT_K)

        narrow = (cfg1[0], 128, cfg1[2], cfg1[3], 4, 8)
        wide = (cfg1[0], *knobs.cta.STAGE1_CONFIG[1:3], cfg1[3], *knobs.cta.STAGE1_CONFIG[4:])
        self.op_cands = [(*cfg1, split(cfg1))]
        runs = split(cfg1)  # variants: no split, half the runs (a shorter sum, longer runs), the other tile width
        self.variant_cands = [(*cfg1, r) for r in sorted({1, runs // 2} - {0, runs})]
        self.variant_cands += [cand for cand in [(*narrow, split(narrow)), (*wide, split(wide))]
                               if cand not in self.op_cands]
        self.partials = torch.empty(max(cta.split_partials_numel(c.M, c.N, cfg, cfg[6])
                                        for cfg in self.op_cands + self.variant_cands), device=self.dev)
        self.split_counters = torch.zeros(4096, dtype=torch.int32, device=self.dev)

        def run(cfg):
            cta.launch_stage1(self.blocks, b, None, self.out, tables, tables, 0, self.flags, self.counters, self.epoch,
                              self.status, 10**9, 0, 1, c.M, fp, 0, kchunk, nch, 0, tp, cfg[:6], self.num_sms,
                              split_k=cfg[6], split_partials=self.partials, split_counters=self.split_counters)

        self.run = run
        self.error = lambda: common.rel_err(self.out.float(), self.want)

    # ---- the CTA stages' cuBLAS forms (rank 0 of its stage; flags are no-ops: every block is there)
    def _cublas_plan(self, M, fp, ns):
        """The stage's ``cta_plan.ChunkPlan`` as the Triton stage's case splits it: no stage-1 share, no tails
        (both stages' configs have the same row blocks and groups, ``cta_plan.block_configs``)."""
        from overlap_backend.runtime import cta_plan

        cfg0, cfg1, kchunk, nch = self._cta_plan(M, fp, ns)
        tiles_m = -(-M // cfg0[0])
        groups = -(-tiles_m // cfg0[3])
        return cta_plan.ChunkPlan(cfg0, cfg1, self.case.ws // 2, tiles_m, groups, (0, 0, 0), 0, fp, 0, groups - 1,
                                  kchunk, nch, 0)

    def _setup_cta_stage0_cublas(self):
        from overlap_backend.codegen import cta
        from overlap_backend.runtime import cta_cublas

        c = self.case
        self._gemm_operands()
        plan = self._cublas_plan(c.M, c.N, CTA_H // (c.ws // 2))
        mp = cta.padded_rows(c.M, plan.cfg0[0])
        blocks = torch.empty(plan.nch, mp, plan.kchunk, device=self.dev, dtype=self.dt)
        self.want = F.gelu(self.ref, approximate="tanh")
        self.outputs = [blocks]
        a, b = self.a, self.b
        self.baseline = ("cuBLAS torch.mm + torch F.gelu tanh (Inductor pointwise proxy)",
                         lambda: F.gelu(torch.mm(a, b), approximate="tanh"))
        self.op_cands, self.variant_cands = [None], []
        self.run = lambda cfg: cta_cublas.stage0(a, (b, None, None, None), blocks, None, plan, c.N, "gelu", "tanh",
                                                 lambda g, j: None)
        self.error = lambda: common.rel_err(
            blocks[:, :c.M].permute(1, 0, 2).reshape(c.M, plan.nch * plan.kchunk)[:, :c.N].float(), self.want)

    def _setup_cta_stage1_cublas(self):
        from overlap_backend.codegen import cta
        from overlap_backend.runtime import cta_cublas

        c = self.case
        tp = c.ws // 2
        fp = c.K // tp
        self._gemm_operands()
        plan = self._cublas_plan(c.M, fp, c.N)
        blocks = self._chunk_major(tp, fp, plan.kchunk, plan.nch, cta.padded_rows(c.M, plan.cfg1[0]))
        out = torch.empty(c.M, tp * c.N, device=self.dev, dtype=self.dt)  # rank 0 of its stage: columns [0, N)
        self.want = self.ref
        self.outputs = [out]
        a, b = self.a, self.b
        self.baseline = ("cuBLAS torch.mm", lambda: torch.mm(a, b))
        self.op_cands, self.variant_cands = [None], []

        def skip(*_):
            return None

        self.run = lambda cfg: cta_cublas.stage1(blocks, b, None, out, plan, fp, 0, None, False, skip, skip, skip)
        self.error = lambda: common.rel_err(out[:, :c.N].float(), self.want)

    # ---- MoE grouped GEMMs
    def _moe_rank(self):
        from overlap_backend.codegen import moe_gemm
        from overlap_backend.runtime import moe_symm

        c = self.case
        h, f, experts, k, tokens = MOE[c.moe]
        ws, e_local, dev = c.ws, experts // c.ws, self.dev
        local = []
        for src in range(ws):  # every source's rows for rank 0's experts (bench_moe's balanced routing)
            gen_ = torch.Generator().manual_seed(1234 + src)
            dest = torch.rand(tokens, experts, generator=gen_).topk(k, dim=1).indices.view(-1).sort().values
            local.append(dest[dest < e_local])
        recv = [len(v) for v in local]
        e_recv = torch.cat(local).to(dev)
        self.rows_sorted = torch.sort(e_recv, stable=True).indices
        self.offsets = torch.cumsum(torch.bincount(e_recv, minlength=e_local), 0).to(torch.int32)
        self.r = self._rand(sum(recv), h)
        self.w_gate = self._rand(e_local, h, f, scale=h ** -0.5)
        self.w_up = self._rand(e_local, h, f, scale=h ** -0.5)
        self.w_down = self._rand(e_local, f, h, scale=f ** -0.5)
        cap = max(recv)
        self.disp = torch.zeros(ws * cap, h, device=dev, dtype=self.dt)
        off = 0
        for s, n in enumerate(recv):
            self.disp[s * cap:s * cap + n] = self.r[off:off + n]
            off += n
        self.recv_off = [0] + torch.tensor(recv).cumsum(0).tolist()  # (and on the device, as the op has them)
        self.recv_off_d = recv_off = torch.tensor(self.recv_off, dtype=torch.int32, device=dev)
        self.mflags = torch.zeros(64, dtype=torch.int32, device=dev)
        self.status = self._status()
        m = self.rows_sorted.shape[0]
        self.act = torch.empty(m, f, device=dev, dtype=self.dt)
        self.own = torch.empty(max(recv[0], 1), h, device=dev, dtype=self.dt)
        self.stage = torch.empty(sum(recv), h, device=dev, dtype=self.dt)
        em = moe_symm.expert_major(m, ws, e_local)
        self.gate_cands = moe_gemm.candidates(self.dt, "gate_up")
        self.down_cands = moe_gemm.candidates(self.dt, "down")
        bms = sorted({cfg[0] for cfg in self.gate_cands + self.down_cands})
        self.plan = moe_symm.plan(self.rows_sorted, self.offsets, recv_off, 0, ws, e_local, bms, em)
        self.one = [(0, ws * e_local, 0, ws)]
        self.start = None if em else (ws - 1) * e_local  # the runtime's walk: own groups first
        self.cap, self.recv_rows = cap, recv
        xg = self.r.index_select(0, self.rows_sorted)
        self.xg = xg
        # float32 reference per expert, in received-row order
        ref = torch.empty(sum(recv), h, device=dev)
        lo = 0
        for e, hi in enumerate(self.offsets.tolist()):
            x = xg[lo:hi].float()
            y = (F.silu(x @ self.w_gate[e].float()) * (x @ self.w_up[e].float())).to(self.dt).float() @ self.w_down[e].float()
            ref[self.rows_sorted[lo:hi]] = y
            lo = hi
        self.want = ref

    def _moe_run(self, cfg_gate, cfg_down, part):
        from overlap_backend.codegen import moe_gemm

        c = self.case
        for ph in self.one:
            if part in ("both", "gate_up"):
                moe_gemm.launch_gate_up(self.disp, self.w_gate, self.w_up, self.act, self.plan, self.mflags, self.mflags,
                                        0, self.status, 10**10, 0, c.ws, self.cap, cfg_gate, self.num_sms, phase=ph,
                                        start_group=self.start)
            if part in ("both", "down"):
                moe_gemm.launch_down(self.act, self.w_down, self.own, self.stage, self.plan, self.mflags[16:],
                                     self.mflags[32:], 0, 0, c.ws, 0, cfg_down, self.num_sms, phase=ph)

    def _moe_error(self, cfg_gate, cfg_down):
        for t in (self.own, self.stage, self.act):
            t.fill_(float("nan"))
        self._moe_run(cfg_gate, cfg_down, "both")
        _sync()
        got = self.stage.float()
        n0 = self.recv_rows[0]
        got[:n0] = self.own[:n0].float()
        return common.rel_err(got, self.want)

    def _setup_moe_gate_up(self):
        self._moe_rank()
        xg, offs, wg, wu = self.xg, self.offsets, self.w_gate, self.w_up
        self.baseline = ("torch._grouped_mm x2 + torch F.silu * up (pointwise proxy)",
                         lambda: F.silu(torch._grouped_mm(xg, wg, offs=offs)) * torch._grouped_mm(xg, wu, offs=offs))
        self.op_cands, self.variant_cands = list(self.gate_cands), []
        self.outputs = []
        self.run = lambda cfg: self._moe_run(cfg, self.down_cands[0], "gate_up")
        self.error_of = lambda cfg: self._moe_error(cfg, self.down_cands[0])

    def _setup_moe_down(self):
        self._moe_rank()
        offs, wd = self.offsets, self.w_down
        act = self._rand(self.xg.shape[0], wd.shape[1])
        self.baseline = ("torch._grouped_mm", lambda: torch._grouped_mm(act, wd, offs=offs))
        self.op_cands, self.variant_cands = list(self.down_cands), []
        self.outputs = []
        self.run = lambda cfg: self._moe_run(self.gate_cands[0], cfg, "down")
        self.error_of = lambda cfg: self._moe_error(self.gate_cands[0], cfg)

    def _setup_moe_grouped_mm(self):
        from overlap_backend.runtime import moe_grouped, moe_symm

        self._moe_rank()
        c = self.case
        ws, e_local = c.ws, self.w_gate.shape[0]
        recv_off = self.recv_off
        per_source = not moe_symm.expert_major(self.rows_sorted.shape[0], ws, e_local)  # (the phased schedule)
        gpl = moe_grouped.plan(self.rows_sorted, self.offsets, self.recv_off_d, 0, ws, e_local, recv_off[-1], self.cap,
                               per_source)
        gate_up = moe_grouped.gate_up_weights(self.w_gate, self.w_up)
        segments = [(i, lo, hi) for i, _, lo, hi in moe_grouped.schedule(ws, recv_off, per_source, 0) if hi > lo]
        stage, disp, wd = self.stage, self.disp, self.w_down
        xg, offs, wg, wu = self.xg, self.offsets, self.w_gate, self.w_up
        self.baseline = ("torch._grouped_mm x3 + torch F.silu * up (rows already sorted)",
                         lambda: torch._grouped_mm(F.silu(torch._grouped_mm(xg, wg, offs=offs))
                                                   * torch._grouped_mm(xg, wu, offs=offs), wd, offs=offs))
        self.op_cands, self.variant_cands = [None], []
        self.outputs = [stage]

        def run(cfg):
            for i, lo, hi in segments:
                stage.index_copy_(0, gpl["seg"][lo:hi], moe_grouped.experts(gpl, i, lo, hi, disp, gate_up, wd))

        self.run = run
        self.error = lambda: common.rel_err(stage.float(), self.want)

    # ---- measurement
    def check(self, cfg) -> float:
        """Poison the outputs, run once, compare with the float32 reference (relative error)."""
        if hasattr(self, "error_of"):
            return self.error_of(cfg)
        for t in self.outputs:
            t.fill_(float("nan"))
        # A form that returns a new tensor: NaN blocks of its allocations' sizes, freed just before the call, so that
        # the caching allocator hands them to it (a row it leaves unwritten then reads NaN, not an earlier result).
        poison = [torch.full(shape, float("nan"), device=self.dev, dtype=self.dt) for shape in self.fresh_outputs]
        del poison
        self.run(cfg)
        _sync()
        return self.error()

    def time(self, fn) -> "common.QueuedTime":
        return common.queued_ms(fn, n=self.reps, warm=5)

    def back_to_back_ms(self, fn) -> float:
        """Event timing of calls enqueued as they run: the host's launch time shows where it exceeds the GPU's."""
        return common.events_ms(fn, n=self.reps, warm=2)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _first_error(fn) -> str | None:
    try:
        fn()
        _sync()
    except Exception as e:  # noqa: BLE001 - a variant that does not compile (or fit) is reported, not fatal
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
    return None


def measure(case: Case, origins: list[str], dev, num_sms: int, reps: int, variants: bool,
            deadline: float = math.inf) -> dict:
    row = {"case": dataclasses.asdict(case), "label": case.label(), "suites": origins}
    try:
        b = Bench(case, dev, num_sms, reps)
    except Exception as e:  # noqa: BLE001
        row["error"] = f"set-up failed: {type(e).__name__}: {str(e)[:300]}"
        return row
    row["baseline"] = b.baseline[0]
    t = b.time(b.baseline[1])
    row["baseline_ms"], row["baseline_host_us"], queued = t.ms, t.host_us, [t.queued]
    configs = [(cfg, "op") for cfg in b.op_cands] + ([(cfg, "variant") for cfg in b.variant_cands] if variants else [])
    results = []
    for cfg, kind in configs:
        r = {"config": list(cfg) if cfg is not None else None, "kind": kind}
        if time.time() > deadline:  # (a variant left uncompiled would compile here, tens of seconds)
            r["error"] = "not run (time box)"
            results.append(r)
            continue
        why = _first_error(lambda: b.run(cfg))
        if why is None:
            err = b.check(cfg)
            r["rel_err"] = err
            if not err <= CHECK_TOL:
                why = f"WRONG (rel err {err:.2e})"
        if why is None:
            t = b.time(lambda: b.run(cfg))
            r["ms"], r["host_us"] = t.ms, t.host_us
            queued.append(t.queued)
        else:
            r["error"] = why
        results.append(r)
    # cuBLAS again after the configs, the faster of the two kept: one run's slow baseline (the same GEMM
    # measured in two rows differed by up to 2x on an H100) skews every ratio of its row.
    t = b.time(b.baseline[1])
    queued.append(t.queued)
    row["baseline_ms_runs"] = [row["baseline_ms"], t.ms]
    row["baseline_ms"] = min(row["baseline_ms_runs"])
    for r in results:
        if "ms" in r:
            r["ratio"] = r["ms"] / row["baseline_ms"]
    row["configs"] = results
    row["all_queued"] = all(queued)  # (False: some call waited on the GPU, its time includes host time)
    summarize(row)
    op_timed = [(r["ms"], cfg) for r, (cfg, kind) in zip(results, configs) if kind == "op" and "ms" in r]
    if op_timed:  # what back-to-back event timing reads at this case (the host's launch time where it is longer)
        op_cfg = min(op_timed, key=lambda x: x[0])[1]
        row["back_to_back_ms"] = {"baseline": b.back_to_back_ms(b.baseline[1]),
                                  "op": b.back_to_back_ms(lambda: b.run(op_cfg))}
    del b
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row


def summarize(row: dict) -> None:
    """The op's time (best of its tuning candidates), the best variant's, in ``row``."""
    ok = [r for r in row.get("configs", ()) if "ms" in r]
    op = [r for r in ok if r["kind"] == "op"]
    if op:
        best = min(op, key=lambda r: r["ms"])
        row.update(op_ms=best["ms"], op_config=best["config"], op_ratio=best["ratio"], op_host_us=best.get("host_us"))
    if ok:
        best = min(ok, key=lambda r: r["ms"])
        row.update(best_ms=best["ms"], best_config=best["config"], best_kind=best["kind"], best_ratio=best["ratio"])
    row["failed"] = [f"{r['config']}: {r['error']}" for r in row.get("configs", ()) if "error" in r]


def fake_measure(case: Case, origins: list[str], variants: bool) -> dict:
    """--dry-run: the row ``measure`` would write, with made-up times (a hash of the case and config)."""
    def h(*parts) -> float:
        return int(hashlib.sha256(repr(parts).encode()).hexdigest()[:8], 16) / 0xFFFFFFFF

    from overlap_backend.codegen import configs as cfgs

    rows = case.M // case.ws
    if case.kernel in ("ag_mm", "mm_rs"):
        op = cfgs.candidates(torch.bfloat16, tma_store_rows=rows, variants=False, kernel=case.kernel)
        var = cfgs.variant_candidates(torch.bfloat16, case.kernel, tma_store_rows=rows)
    elif case.kernel == "mm_ar":
        op, var = cfgs.candidates(torch.bfloat16, variants=False), cfgs.variant_candidates(torch.bfloat16, "mm_rs")
    else:
        op, var = [None], []
    base = 2 * case.M * case.K * case.N / 700e9 + 0.01
    row = {"case": dataclasses.asdict(case), "label": case.label(), "suites": origins, "baseline": "(dry run)",
           "baseline_ms": base, "baseline_host_us": 8.0, "all_queued": True, "configs": []}
    for cfg, kind in [(c, "op") for c in op] + ([(c, "variant") for c in var] if variants else []):
        ms = base * (0.95 + 0.4 * h(case, cfg))
        row["configs"].append({"config": list(cfg) if cfg else None, "kind": kind, "ms": ms, "ratio": ms / base,
                               "rel_err": 1.7e-3, "host_us": 20 + 40 * h(cfg)})
    summarize(row)
    row["back_to_back_ms"] = {"baseline": max(base, 0.008), "op": max(row["op_ms"], row["op_host_us"] / 1e3)}
    return row


# ----------------------------------------------------------------------------------- compilation
def _compile_job(job) -> tuple[int, str | None, float]:
    """Worker: compile and load one (case, config) without launching (``launcher.preloading``)."""
    index, case, cfg = job
    t0 = time.time()
    try:
        import triton

        from overlap_backend.codegen import launcher

        dev = torch.device("cuda")
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))
        num_sms = torch.cuda.get_device_properties(dev).multi_processor_count
        b = Bench(case, dev, num_sms, 1)
        with launcher.preloading():
            b.run(b.op_cands[0] if cfg is None else cfg)  # None: the config the case's set-up derives
        return index, None, time.time() - t0
    except Exception as e:  # noqa: BLE001 - the timing pass reports it again
        return index, f"{type(e).__name__}: {str(e)[:200]}", time.time() - t0


def compile_jobs(todo: list[tuple[Case, list[str]]], variants: bool) -> list[tuple[int, Case, object]]:
    """One (case, config) per kernel variant to compile: configs of the same kernel, ws and epilogue
    compile once (other integer sizes with the same divisibility reuse the binary)."""
    from overlap_backend.codegen import configs as cfgs

    jobs, seen = [], set()
    for case, _ in todo:
        rows = case.M // case.ws
        if case.kernel in CUBLAS_FORMS:
            continue
        if case.kernel in ("ag_mm", "mm_rs"):
            cands = cfgs.candidates(torch.bfloat16, tma_store_rows=rows, variants=False, kernel=case.kernel)
            cands += cfgs.variant_candidates(torch.bfloat16, case.kernel, tma_store_rows=rows) if variants else []
        elif case.kernel == "mm_ar":
            cands = cfgs.candidates(torch.bfloat16, variants=False) + (
                cfgs.variant_candidates(torch.bfloat16, "mm_rs") if variants else [])
        else:  # configs derived in set-up (CTA, MoE): one job per case compiles its first
            cands = [None]
        for cfg in cands:
            key = (case.kernel, case.ws, cfg, case.epilogue) if cfg is not None else case
            if key not in seen:
                seen.add(key)
                jobs.append((len(jobs), case, cfg))
    return jobs


def precompile(todo, variants: bool, workers: int, deadline: float) -> dict:
    """Compile every kernel variant in ``workers`` processes (into Triton's on-disk cache) before timing; the
    jobs that ran out of GPU memory beside the others (each worker holds its case's tensors) go again one at a
    time."""
    jobs = compile_jobs(todo, variants)
    stats = {"jobs": len(jobs), "workers": workers, "failed": [], "done": 0, "retried": 0, "seconds": 0.0}
    if workers <= 0 or not jobs:
        return stats
    t0 = time.time()
    ran = _compile_in_pool(jobs, range(len(jobs)), workers, deadline)
    stats["done"] = len(ran)
    out_of_memory = [i for i, err in ran.items() if err.startswith("OutOfMemoryError")]
    stats["retried"] = len(out_of_memory)
    if out_of_memory:
        ran.update(_compile_in_pool(jobs, out_of_memory, 1, deadline))
    stats["failed"] = [f"{jobs[i][1].label()} {jobs[i][2]}: {err}" for i, err in sorted(ran.items()) if err]
    stats["seconds"] = time.time() - t0
    return stats


def _compile_in_pool(jobs, indices, workers: int, deadline: float) -> dict[int, str]:
    """``_compile_job`` on ``jobs[i]`` for each of ``indices`` in ``workers`` spawned processes until
    ``deadline``: {index: error, "" where it compiled} of every job that finished."""
    import multiprocessing as mp

    ran = {}
    pool = mp.get_context("spawn").Pool(workers)
    try:
        pending = [pool.apply_async(_compile_job, (jobs[i],)) for i in indices]
        for res in pending:
            left = deadline - time.time()
            if left <= 0:
                break
            try:
                index, err, _ = res.get(timeout=left)
            except mp.TimeoutError:
                break
            ran[index] = err or ""
    finally:
        pool.terminate()
        pool.join()
    return ran


# ------------------------------------------------------------------------------------------ output
def _fmt_cfg(cfg) -> str:
    if cfg is None:
        return "-"
    BM, BN, BK, G, st, w, *rest = cfg  # rest: a store variant (bool or name); the CTA stages' split-K runs (int)
    tail = ""
    for item in rest:
        if isinstance(item, bool):
            tail += " tma" if item else ""
        elif isinstance(item, int):
            tail += f" split-K {item}" if item > 1 else " no split"
        else:
            tail += f" {item}"
    return f"{BM}x{BN}x{BK} g{G} s{st} w{w}{tail}"


def table_markdown(rows: list[dict], info: dict, skipped: list[str]) -> str:
    head = ["kernel", "ws", "local M×K×N", "fused epilogue", "suites", "baseline", "baseline ms", "op kernel ms",
            "op / baseline", "op config", "best variant ms", "best / baseline", "best config", "rel err",
            "host µs op / baseline", "back to back op / baseline"]
    body = []
    for r in rows:
        c = r["case"]
        if "error" in r:
            body.append([c["kernel"], c["ws"], f"{c['M']}×{c['K']}×{c['N']}", c["epilogue"] or "-", "; ".join(r["suites"]),
                         r["error"], "", "", "", "", "", "", "", "", "", ""])
            continue
        errs = [x["rel_err"] for x in r.get("configs", ()) if "rel_err" in x]
        flag = lambda v: "" if v is None else (" **>1.03**" if v > 1.03 else "")  # noqa: E731
        body.append([
            c["kernel"], c["ws"], f"{c['M']}×{c['K']}×{c['N']}" + (f" ({c['moe']})" if c["moe"] else ""),
            c["epilogue"] or "-", "; ".join(r["suites"]), r["baseline"], common.fmt_ms(r["baseline_ms"]),
            common.fmt_ms(r.get("op_ms")), (f"{r['op_ratio']:.3f}" + flag(r["op_ratio"])) if "op_ratio" in r else "n/a",
            _fmt_cfg(r.get("op_config")), common.fmt_ms(r.get("best_ms")),
            f"{r['best_ratio']:.3f}" if "best_ratio" in r else "n/a",
            _fmt_cfg(r.get("best_config")) + (" (variant)" if r.get("best_kind") == "variant" else ""),
            f"{max(errs):.1e}" if errs else "n/a",
            f"{r['op_host_us']:.0f} / {r['baseline_host_us']:.0f}" if r.get("op_host_us") else "n/a",
            _back_to_back(r)])
    text = [f"# The op kernels alone against cuBLAS ({info.get('gpu', '?')})", "",
            f"`{info['command']}`", "", common.info_markdown(info), "",
            "Ratios are the kernel's time over the baseline's on the same local GEMM (fused epilogue: over cuBLAS "
            "plus torch's separate pointwise op, the stand-in for Inductor's kernel). `op kernel`: the best of the "
            "op's tuning candidates (what the op runs); `best variant`: the best of those and the bench-only "
            "variants. **>1.03**: the ops take cuBLAS there once kernel_ratios.json is installed. `ag_mm_cublas`, "
            "`mm_rs_cublas`, `mm_ar_cublas`: what the op then runs, its cuBLAS path (the GEMM per chunk or band, "
            "the flag writes, the sum of the partials; no transfers) over one cuBLAS GEMM. `cta_stage<i>_cublas`: the "
            "op's cuBLAS form of that CTA stage over the same baseline (the stage takes it under \"auto\" only where "
            "it beats the stage's kernel); `moe_grouped_mm`: the MoE experts' torch._grouped_mm form (gather, both "
            "GEMMs, scatter) over the grouped GEMMs on sorted rows. Times are GPU times with every call queued "
            "(the ops replay CUDA graphs); `host µs`: the host's time to enqueue one call; `back to back`: the "
            "ratio as event timing of calls enqueued as they run reads it, where a launch slower than its "
            "kernel counts (†: some call of the row waited on the GPU while queued, so its times hold host time).",
            "",
            common.markdown_table(head, body)]
    failures = [f"- {r['label']}: {f}" for r in rows for f in r.get("failed", ())]
    if failures:
        text += ["", "## Configs that did not compile, fit or check", "", *failures]
    if skipped:
        text += ["", "## Not run (time box)", "", *[f"- {s}" for s in skipped]]
    return "\n".join(text) + "\n"


def _back_to_back(row: dict) -> str:
    b2b = row.get("back_to_back_ms")
    if not b2b:
        return "n/a"
    return f"{b2b['op'] / b2b['baseline']:.3f}" + ("" if row.get("all_queued", True) else " †")


def variants_markdown(rows: list[dict]) -> str:
    """Per variant config: at how many cases it ran, beat the op's best, and its geometric-mean ratio to it."""
    stats: dict[str, list[float]] = {}
    for r in rows:
        op = r.get("op_ms")
        for x in r.get("configs", ()):
            if x["kind"] == "variant" and op:
                key = f"{r['case']['kernel']} {_fmt_cfg(x['config'])}"
                stats.setdefault(key, []).append(x["ms"] / op if "ms" in x else math.nan)
    body = []
    for key, v in sorted(stats.items()):
        ok = [x for x in v if not math.isnan(x)]
        gm = math.exp(sum(map(math.log, ok)) / len(ok)) if ok else math.nan
        body.append([key, len(v), len(v) - len(ok), sum(x < 0.99 for x in ok), f"{gm:.3f}" if ok else "n/a",
                     f"{min(ok):.3f}" if ok else "n/a"])
    return ("# Bench-only kernel variants against the op's best candidate\n\nPer variant: cases, failed "
            "(compile / fit / check), cases where it beat the op's best by >1%, geometric mean and best of "
            "variant / op-best time. Promote winners into `knobs.codegen.CANDIDATES_16BIT` or set "
            "`codegen.TUNE_VARIANTS=True`.\n\n" + common.markdown_table(
                ["variant", "cases", "failed", "wins", "geo-mean / op best", "best / op best"], body) + "\n")


def ratio_entries(rows: list[dict], info: dict, out: str) -> list[dict]:
    """``spec/kernel_ratios.py`` entries: the op's ratio (its tuning candidates) at every measured case."""
    entries = []
    for r in rows:
        if "op_ratio" not in r:
            continue
        c = r["case"]
        entries.append({"gpu": info.get("gpu", "?"), "kernel": c["kernel"], "dtype": "bfloat16", "ws": c["ws"],
                        "M": c["M"], "K": c["K"], "N": c["N"], "fused": bool(c["epilogue"]),
                        "epilogue": c["epilogue"], "moe": c["moe"], "ratio": round(r["op_ratio"], 4),
                        "kernel_ms": round(r["op_ms"], 4), "baseline_ms": round(r["baseline_ms"], 4),
                        "config": r["op_config"], "best_variant_ratio": round(r.get("best_ratio", r["op_ratio"]), 4),
                        "best_config": r.get("best_config"), "source": out})
    return entries


def write_outputs(out: Path, rows, info, skipped, compile_stats) -> None:
    from overlap_backend.spec import kernel_ratios

    out.mkdir(parents=True, exist_ok=True)
    common.write_json(out / "results.json", {"info": info, "compile": compile_stats, "rows": rows, "skipped": skipped})
    (out / "table.md").write_text(table_markdown(rows, info, skipped))
    (out / "variants.md").write_text(variants_markdown(rows))
    doc = kernel_ratios.document(ratio_entries(rows, info, str(out)),
                                 f"bench/suites/bench_kernels.py, {info.get('gpu')}, torch {info.get('torch')}, "
                                 f"triton {info.get('triton')}, {info.get('date')}")
    (out / "kernel_ratios.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "command.txt").write_text(info["command"] + "\n")
    (out / "README.md").write_text(
        f"# Kernel benchmark of record, {info.get('gpu')}\n\n{common.info_markdown(info)}\n\n"
        f"Cases: {len(rows)} measured, {len(skipped)} left out by the time box; compilation: "
        f"{compile_stats.get('jobs', 0)} variants in {compile_stats.get('workers', 0)} processes, "
        f"{compile_stats.get('seconds', 0):.0f} s, {len(compile_stats.get('failed', []))} failed "
        f"({compile_stats.get('retried', 0)} retried alone after running out of GPU memory beside the others; "
        "a variant that failed here is compiled again when its case is timed).\n\n"
        "Files: [table.md](table.md) (the kernel table), [variants.md](variants.md), results.json, "
        "kernel_ratios.json (install: copy over overlap_backend/spec/kernel_ratios.json).\n")


def run_info(dry: bool, argv: list[str]) -> dict:
    import triton

    info = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": platform.node(),
            "python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
            "world_size": 1, "gpu_count_visible": torch.cuda.device_count() if not dry else 0,
            "env": {k: os.environ.get(k) for k in (*common.SAFE_ENV, "CUDA_VISIBLE_DEVICES")},
            "command": " ".join(["python bench/suites/bench_kernels.py", *(shlex.quote(a) for a in argv)])}
    if dry:
        info["gpu"] = "NVIDIA H200 (dry run, made-up times)"
    else:
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
        info["sms"] = torch.cuda.get_device_properties(0).multi_processor_count
    return info


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="results folder (bench/results/kernels_<hardware>_<date>)")
    p.add_argument("--quick", action="store_true", help="ten cases at ws 4, the op candidates only")
    p.add_argument("--dry-run", action="store_true", help="no GPU: the case list and every output, made-up times")
    p.add_argument("--kernels", default=",".join(KERNELS), help="comma-separated subset of " + ", ".join(KERNELS))
    p.add_argument("--ws", default="2,4,8", help="world sizes whose local shapes to measure")
    p.add_argument("--budget-s", type=float, default=300.0, help="start no case after this many seconds")
    p.add_argument("--jobs", type=int, default=max(1, min(15, (os.cpu_count() or 2) - 1)),
                   help="compile worker processes (0: compile while timing)")
    p.add_argument("--reps", type=int, default=30, help="timed repetitions per measurement (median)")
    p.add_argument("--no-variants", action="store_true", help="only the op's tuning candidates")
    p.add_argument("--list", action="store_true", help="print the case list and exit")
    args = p.parse_args(argv)
    args.kernels = tuple(k for k in args.kernels.split(",") if k)
    bad = [k for k in args.kernels if k not in KERNELS]
    if bad:
        p.error(f"--kernels: {bad} not among {KERNELS}")
    args.ws = tuple(int(w) for w in args.ws.split(","))
    if any(w not in WORLD_SIZES for w in args.ws):
        p.error(f"--ws: each of {WORLD_SIZES}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.time()
    todo = cases(args.quick, args.kernels, args.ws)
    variants = not (args.no_variants or args.quick)
    if args.list:
        for case, origins in todo:
            print(case.label(), "|", "; ".join(origins))
        print(f"{len(todo)} cases, {len(compile_jobs(todo, variants))} kernel variants to compile")
        return 0
    out = Path(args.out)
    info = run_info(args.dry_run, sys.argv[1:] if argv is None else list(argv))
    rows, skipped, compile_stats = [], [], {}
    if args.dry_run:
        rows = [fake_measure(c, o, variants) for c, o in todo]
        compile_stats = {"jobs": len(compile_jobs(todo, variants)), "workers": 0, "seconds": 0.0, "failed": []}
        write_outputs(out, rows, info, skipped, compile_stats)
        print(f"dry run: {len(rows)} cases -> {out}")
        return 0
    import triton

    from overlap_backend.codegen import epilogue as gen

    dev = torch.device("cuda")
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))
    num_sms = torch.cuda.get_device_properties(dev).multi_processor_count
    for spec in sorted({c.epilogue for c, _ in todo if c.kernel in ("ag_mm", "mm_rs")} | {""}):
        gen.build(spec, torch.bfloat16)  # written once here, before the workers import it
    print(f"{info['gpu']}, torch {info['torch']}, triton {info['triton']}: {len(todo)} cases", flush=True)
    compile_stats = precompile(todo, variants, args.jobs, start + 0.55 * args.budget_s)
    print(f"compiled {compile_stats['done']}/{compile_stats['jobs']} variants in {compile_stats['seconds']:.0f} s "
          f"({len(compile_stats['failed'])} failed, {compile_stats['retried']} retried alone for memory)", flush=True)
    for i, (case, origins) in enumerate(todo):
        if time.time() - start > args.budget_s:
            skipped = [c.label() for c, _ in todo[i:]]
            break
        row = measure(case, origins, dev, num_sms, args.reps, variants, start + args.budget_s + 15)
        rows.append(row)
        print(f"{case.label()}: baseline {common.fmt_ms(row.get('baseline_ms'))} ms, op "
              f"{common.fmt_ms(row.get('op_ms'))} ({row.get('op_ratio', math.nan):.3f}x), best "
              f"{common.fmt_ms(row.get('best_ms'))} ({row.get('best_ratio', math.nan):.3f}x)"
              + (f" {row['error']}" if "error" in row else "")
              + (f" [{len(row['failed'])} failed]" if row.get("failed") else ""), flush=True)
        if i % 10 == 9:
            write_outputs(out, rows, info, [c.label() for c, _ in todo[i + 1:]], compile_stats)
    write_outputs(out, rows, info, skipped, compile_stats)
    print(f"{len(rows)} cases in {time.time() - start:.0f} s -> {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
