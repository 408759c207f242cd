"""The kernel benchmark's cases (``bench_kernels.py``): every kernel the ops run, at the local shapes of the 2-, 4-
and 8-GPU tables of every suite and at decode sizes, as rank 0 of its group."""

from __future__ import annotations

import dataclasses

KERNELS = ("ag_mm", "mm_rs", "mm_ar", "oneshot", "ag_mm_cublas", "mm_rs_cublas", "mm_ar_cublas", "cta_stage0",
           "cta_stage1", "cta_stage0_cublas", "cta_stage1_cublas", "moe_gate_up", "moe_down", "moe_grouped_mm")
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
    # the GEMMs the ops choose cuBLAS for first, then those cuBLAS paths; 4 GPUs first: what a time box cuts is the
    # least needed
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

