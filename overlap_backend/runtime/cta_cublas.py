"""The cuBLAS forms of the two ``cta_pipeline_mlp`` stages (``knobs.cta.STAGE0_GEMM`` / ``STAGE1_GEMM``).

They keep the Triton kernels' protocol (``codegen/cta.py``): the same chunk-major blocks, flags, Y
rows and tails, so either stage may run on cuBLAS while the other runs its kernel, and the plan
(``cta_plan.ChunkPlan``: share, tails, K-chunks) is the same whatever the forms.

- **Stage 0**: per (row group, K-chunk), ``act(x @ W1 (+ b1) [, x @ W3 (+ b3)])`` by ``addmm`` into
  the staged block, then a stream write raises its done flag and the copy engine ships it as it
  ships the kernel's (``cta_symm._push_blocks``); the last group's tail columns go to ``keep``, which
  the Triton tail kernel multiplies by their W2 rows. A stage-1 rank's share, the same way, flagless.
- **Stage 1**: per row group, ``Y rows = b2 + sum of block @ W2 rows``: ``addmm`` accumulating into
  the output, each block after its arrival flag; the tails' partial products added after theirs;
  then the copy engine pushes the rows into every peer's Y buffer and ``signal_kernel`` raises their
  row-block flags.

Waits: eager calls on the stream (host epochs); captured calls by ``wait_kernel``, since their
epoch is counted on the device (a stream wait would bake one value into the graph).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..spec import kernel_ratios, knobs
from ..spec import symm_layout as layout
from . import cuda as _cuda
from .symm.lowering_helpers import matmul_into

FORMS = ("auto", "triton", "cublas")


def stage_gemms(ws: int, M: int, H: int, F_: int, N: int, dtype, gpu: str | None = None) -> tuple[str, str]:
    """(stage 0's form, stage 1's form): "triton" or "cublas", from the knobs and, for "auto", the
    measured kernel ratios at the stage's local GEMM (stage 0: [M, H] @ [H, F/tp], its GELU
    epilogue fused; stage 1: [M, F] @ [F, N/tp]); nothing measured near: the kernel. SwiGLU's stage 0
    is decided by the same entries (only GELU's kernel is measured). Shapes, dtype, the GPU's name,
    the ratio file and knobs only: every rank decides alike."""
    tp = ws // 2
    return stage_form(0, M, H, F_ // tp, ws, dtype, gpu), stage_form(1, M, F_, N // tp, ws, dtype, gpu)


def stage_form(stage: int, M: int, K: int, N: int, ws: int, dtype, gpu: str | None = None) -> str:
    """Stage ``stage``'s form at its local GEMM [M, K] @ [K, N] (what the cost model prices too). "auto":
    cuBLAS where the stage kernel measured slower than ``knobs.symm.CUBLAS_ABOVE_RATIO`` times cuBLAS and the
    cuBLAS form measured faster than the kernel; the kernel where the form was not measured near this shape on
    this GPU (its GEMMs per row group and K-chunk cost 1.06-11x one GEMM on an H100)."""
    return _form(f"STAGE{stage}_GEMM", f"cta_stage{stage}", M, K, N, ws, dtype, stage == 0, gpu)


def _form(name, kernel, M, K, N, ws, dtype, fused, gpu) -> str:
    value = getattr(knobs.cta, name)
    if value not in FORMS:
        raise ValueError(f"knobs.cta.{name} = {value!r}: one of {', '.join(map(repr, FORMS))}")
    if value != "auto":
        return value
    # the form itself (bench_kernels' "<kernel>_cublas": its chunked GEMMs and separate activation) must have
    # been measured beating the kernel
    choice = kernel_ratios.measured_choice(kernel, M, K, N, path_required=True, ws=ws, dtype=dtype, fused=fused,
                                           gpu=gpu)
    return choice or "triton"


def stage0_kernel_form(M: int, H: int, Fp: int, ws: int, dtype, gpu: str | None = None) -> str | None:
    """The Gluon form (``codegen/cta_ws.py``) stage 0's kernel is asked to run in at its local GEMM [M, H] @ [H, Fp]
    (``cta.stage0_form`` then checks that it applies), from ``knobs.cta.STAGE0_FORM``; "measured": the kernel
    benchmark's fastest form near this shape where it beat the Triton kernel (``kernel_ratios.adopted_variant``).
    None: the Triton kernel. Shapes, dtype, the GPU's name, the ratio file and knobs only: alike on every rank."""
    value = knobs.cta.STAGE0_FORM
    if value != "measured":
        return value
    adopted = kernel_ratios.measured_variant("cta_stage0", M, H, Fp, ws=ws, dtype=dtype, fused=True, gpu=gpu)
    return adopted[6] if adopted else None


def form_ratio(kernel: str, M: int, K: int, N: int, **kw) -> float | None:
    """The cuBLAS form of CTA stage ``kernel`` ("cta_stage0" / "cta_stage1"): its measured time over one whole
    cuBLAS GEMM (plus the separate activation) near this GEMM, or None where it was not measured."""
    return kernel_ratios.measured_ratio(kernel + "_cublas", M, K, N, **kw)


# ------------------------------------------------------------------------------ the GEMM steps
def first_gemm(x, w1, b1, w3, b3, cols: slice, out, activation: str, approximate: str) -> None:
    """``out = act(x @ w1[:, cols] (+ b1) [, x @ w3[:, cols] (+ b3)])``, ``out`` a (strided) block view."""
    matmul_into(x, w1[:, cols], None if b1 is None else b1[cols], out)
    if activation == "swiglu":
        up = out.new_empty(out.shape)
        matmul_into(x, w3[:, cols], None if b3 is None else b3[cols], up)
        F.silu(out, inplace=True)
        out.mul_(up)
    else:
        torch._C._nn.gelu_(out, approximate=approximate)


def stage0(x, first, blocks, keep, plan, fp: int, activation: str, approximate: str, done) -> None:
    """Stage-0 rank: ``blocks`` [nch, Mp, kchunk] (staged, chunk-major), in the kernel's order (row
    group by row group, K-chunk by K-chunk); ``done(g, j)`` after block (g, j) is written. Row group
    ``plan.tail_group`` ships ``plan.fship`` of the ``fp`` columns; its rest goes to ``keep``
    [Mp - m0, fp - fship] (rows from its first row ``m0``)."""
    w1, b1, w3, b3 = first
    M, kchunk = x.shape[0], plan.kchunk
    rows = plan.cfg0[0] * plan.cfg0[3]
    for g in range(plan.groups):
        r0, r1 = g * rows, min(M, (g + 1) * rows)
        shipped = plan.fship if g == plan.tail_group else fp
        for j in range(min(plan.nch, -(-shipped // kchunk))):
            c0 = j * kchunk
            w = min(kchunk, shipped - c0)
            first_gemm(x[r0:r1], w1, b1, w3, b3, slice(c0, c0 + w), blocks[j, r0:r1, :w], activation, approximate)
            done(g, j)
        if g == plan.tail_group and plan.tail:
            first_gemm(x[r0:M], w1, b1, w3, b3, slice(plan.fship, fp), keep[:M - r0], activation, approximate)


def share(x, first, own, plan, activation: str, approximate: str) -> None:
    """Stage-1 rank: its share of the first GEMM (the last ``f1`` columns) into its own chunks ``own``
    [nch1, Mp, kchunk], which its stage 1 reads in stream order (no flags)."""
    w1, b1, w3, b3 = first
    M, kchunk = x.shape[0], plan.kchunk
    for i in range(plan.nch1):
        c0 = i * kchunk
        w = min(kchunk, plan.f1 - c0)
        first_gemm(x, w1, b1, w3, b3, slice(c0, c0 + w), own[i, :M, :w], activation, approximate)


def stage1_steps(plan, fp: int, g: int) -> list[tuple[int, int, int, int | None]]:
    """Row group ``g``'s K-steps in the kernel's arrival order: (block of A, first W2 row, width,
    arrival flag or None): the own share's chunks first, then chunk j of every stage-0 rank, then j+1."""
    tp, nch, kchunk = plan.tp, plan.nch, plan.kchunk
    steps = [(tp * nch + i, tp * fp + i * kchunk, min(kchunk, plan.f1 - i * kchunk), None) for i in range(plan.nch1)]
    shipped = plan.fship if g == plan.tail_group else fp
    for j in range(-(-shipped // kchunk)):
        for p in range(tp):
            steps.append((p * nch + j, p * fp + j * kchunk, min(kchunk, shipped - j * kchunk), (g * tp + p) * nch + j))
    return steps


def stage1(a, w2, b2, out, plan, fp: int, idx: int, part, ship_first: bool, wait, ship, before_tails) -> None:
    """Stage-1 rank ``idx``: its columns of ``out`` [M, N] (``b2``: [N/tp] in out's dtype, or None).
    ``a``: [tp * nch + nch1, Mp, kchunk]; ``w2``: [F, N/tp]; ``part``: the tails' partial products
    [tp, M, N/tp] (None: no tails). Callbacks: ``wait(word, count, nbands)`` for flag words of the
    call's CTA block, ``ship(r0, r1)`` the rows to every peer and their flags, ``before_tails()``
    orders the shipped rows' copy before the tails are added to them (``ship_first``: the last
    group's rows go out without them, as the kernel's ``SHIP_BEFORE_TAIL``)."""
    M, N = out.shape
    ns = N // plan.tp
    bm = plan.cfg1[0]
    rows = bm * plan.cfg1[3]
    tiles_m = -(-M // bm)
    ys = out[:, idx * ns:(idx + 1) * ns]
    for g in range(plan.groups):
        r0, r1 = g * rows, min(M, (g + 1) * rows)
        dst = ys[r0:r1]
        for n, (block, k0, w, flag) in enumerate(stage1_steps(plan, fp, g)):
            if flag is not None:
                wait(layout.CTA_ARRIVED + flag, 1, plan.nch)
            if n == 0:
                matmul_into(a[block, r0:r1, :w], w2[k0:k0 + w], b2, dst)
            else:
                dst.addmm_(a[block, r0:r1, :w], w2[k0:k0 + w])
        tails = part is not None and g == plan.tail_group
        if tails and ship_first:
            ship(r0, r1)
            before_tails()
        if tails:
            for p in range(plan.tp):
                wait(layout.CTA_TAIL_ARRIVED + p * tiles_m + r0 // bm, tiles_m - r0 // bm, tiles_m)
                dst.add_(part[p, r0:r1])
        if not (tails and ship_first):
            ship(r0, r1)


# ------------------------------------------------------------------------- flags of one call
class CallFlags:
    """How a cuBLAS stage of one call waits for and raises the flags of the call's CTA block
    (``base``): eager, stream operations with the host's ``epoch``; captured (``epoch`` None), the
    one-program kernels of ``codegen/cta_flags.py`` with the device epoch."""

    def __init__(self, st, base: int, epoch: int | None, compute, op_code: int):
        self.st, self.base, self.epoch, self.compute, self.op_code = st, base, epoch, compute, op_code
        self.epoch_word = base + layout.CTA_EPOCH

    def wait(self, word: int, count: int, nbands: int, skip: int = -1, index0: int | None = None) -> None:
        """Later work on the compute stream waits for words ``word + i`` (``i < count``, ``i != skip``) of
        the block; a captured call's wait that gives up reports them as the kernels do (``index0``:
        the first one's index there; default: its index in the arrival or tail flags)."""
        st = self.st
        if self.epoch is None:
            from ..codegen import cta_flags

            op = self.op_code
            if index0 is None:
                tail = word >= layout.CTA_TAIL_ARRIVED
                op = layout.OP_CTA_TAIL if tail else op
                index0 = word - (layout.CTA_TAIL_ARRIVED if tail else layout.CTA_ARRIVED)
            with torch.cuda.stream(self.compute):
                cta_flags.launch_wait(st.flag_arg(0), self.base + word, count, self.epoch_word, st.status_arg(),
                                      st.timeout_ns, st.rank, op, index0, nbands, skip=skip)
            return
        for i in range(count):
            if i != skip:
                st.stream_wait(self.base + word + i, self.epoch, self.compute, nbands)

    def wait_ready(self, first: int, count: int) -> None:
        """Ranks ``first .. first + count - 1`` (but this one) started this call: a captured call's
        stores into their buffers may go (an eager call's stream waited for it already)."""
        if self.epoch is None:
            skip = self.st.rank - first if first <= self.st.rank < first + count else -1
            self.wait(layout.CTA_READY + first, count, 1, skip=skip, index0=layout.READY_FLAG_BASE + first)

    def raise_done(self, g: int, j: int, nch: int) -> None:
        """Stage 0's block (g, j) is staged: its local done flag (the push stream awaits it; captured,
        for >= 1 and resets it)."""
        addr = self.st.flag_addr(self.base + layout.CTA_DONE + g * nch + j)
        _cuda.write_value32(addr, 1 if self.epoch is None else self.epoch, self.compute)

    def ship_rows(self, out, r0: int, r1: int, idx: int, tp: int, y_offset: int, bm: int) -> None:
        """Push stream: rows ``[r0, r1)`` of stage-1 rank ``idx``'s columns of ``out`` into every peer's
        Y buffer ([M, N] at ``y_offset``), then raise those row blocks' Y flags there."""
        from ..codegen import cta_flags

        st, push = self.st, self.st.push_stream
        M, N = out.shape
        es, ns = out.element_size(), N // tp
        push.wait_stream(self.compute)
        first = (r0 * N + idx * ns) * es
        for q in range(1, st.ws):
            peer = (st.rank + q) % st.ws
            if tp == 1:  # whole rows: one contiguous span
                _cuda.memcpy_async(st.data_addr(peer, y_offset + first), out.data_ptr() + first, (r1 - r0) * N * es,
                                   push)
            else:
                _cuda.memcpy2d_async(st.data_addr(peer, y_offset + first), N * es, out.data_ptr() + first, N * es,
                                     ns * es, r1 - r0, push)
        tiles_m = -(-M // bm)
        with torch.cuda.stream(push):
            cta_flags.launch_signal(st.flag_arg(0), st.peer_tables()[1], self.base + layout.CTA_Y_DONE + idx * tiles_m
                                    + r0 // bm, -(-r1 // bm) - r0 // bm, self.epoch_word, st.rank, st.ws)

    def after_push(self) -> None:
        """The compute stream waits for what the push stream copied (before it changes those rows)."""
        self.compute.wait_stream(self.st.push_stream)


def preload(st, graph_base: int, eager_base: int) -> None:
    """Compile and load the flag kernels (inside ``launcher.preloading()``; word indices are not
    specialised, so one launch of each covers every call)."""
    from ..codegen import cta_flags

    for base in (eager_base, graph_base):
        cta_flags.launch_wait(st.flag_arg(0), base, 1, base + layout.CTA_EPOCH, st.status_arg(), st.timeout_ns,
                              st.rank, layout.OP_CTA_STAGE1, 0, 1)
        cta_flags.launch_signal(st.flag_arg(0), st.peer_tables()[1], base, 1, base + layout.CTA_EPOCH, st.rank, st.ws)
