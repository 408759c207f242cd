"""The ``symm`` implementation of ``overlap::mm_ar`` (GEMM then all-reduce).

Up to ``knobs.symm.ONESHOT_MAX_BYTES`` of partial: one-shot (cuBLAS partial, pushed whole to every
peer, summed by one small kernel that also runs the epilogue). Above: ``mm_rs``'s reduce-scatter over
``rounds`` row blocks; each round's reduced chunk is pushed to every peer while the next round
computes, and copied out of the receive buffer on arrival; on cuBLAS where the kernel would run one
round (``ar_gemm``), else on the persistent producer kernel.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...spec import epilogue as _epilogue
from ...spec import kernel_ratios, knobs
from ...spec import symm_layout as layout
from .. import cuda as _cuda
from ..lowering import register
from . import private_graphs
from .lowering_helpers import (PATHS, aligned, capture_problem, compute_stream, preload_once, captured_call_problem, capturing, call_state, epilogue_pointers,
                               generated_epilogue, kernel_weight, load_kernels, matmul_into, reduce_slots, run_on_p2p,
                               tma_aligned, tune, tuned_configs, wait_on_push_streams, zero_contraction)
from .mm_rs import cublas_min_rows, launch_rs_kernel, mm_problem, peer_store_args, rs_gemm


def ar_rounds(m: int, ws: int) -> int:
    """Row blocks of ``mm_ar``: enough that the last round's all-gather is short, chunks of at least
    ``knobs.symm.AR_ROWS_PER_CHUNK`` rows so that each stays an efficient GEMM."""
    return max(1, min(layout.AR_MAX_ROUNDS, m // (ws * knobs.symm.AR_ROWS_PER_CHUNK)))


@register("symm", "mm_ar")
def mm_ar(a, b, bias, reduce_op, group_name, epilogue="", epilogue_args=()):
    """One-shot: the epilogue runs in the sum kernel. Rounds: the all-reduce, then the epilogue as
    one generated pointwise kernel (the reduced rows of other ranks arrive by copy engine after the
    GEMM's last tile, so no GEMM tile could apply it)."""
    if b.shape[1] == 0:  # no output columns: nothing to reduce, nothing to send
        out = a.new_empty((a.shape[0], 0), dtype=torch.result_type(a, b))
        return _epilogue.apply(epilogue, out, epilogue_args) if epilogue else out
    if a.shape[1] == 0:  # an empty contraction: (a @ b + bias) is bias or zeros, all-reduced as usual
        a, b = zero_contraction(a, b)
    args = (a, b, bias, reduce_op, group_name, epilogue, epilogue_args)
    why = mm_problem(a, b, bias, reduce_op) or capture_problem(a)
    graph = why is None and capturing(a)
    st, why = (None, why) if why else call_state(group_name, a.device, graph)
    if st is not None and graph:
        why = captured_call_problem(st, *_mm_ar_needs(a, b, st.ws))
    if st is None or why:
        return run_on_p2p("mm_ar", why, group_name, *args)
    g = generated_epilogue(epilogue, a.dtype)
    out, fused = _mm_ar_symm(st, a, b, bias, reduce_op, g, epilogue_args, graph)
    return out if fused else _epilogue_after(epilogue, g, out, epilogue_args)


def _epilogue_after(epilogue: str, g, out: Tensor, epilogue_args) -> Tensor:
    """``epilogue`` applied to a finished ``out``: one generated pointwise kernel (``g``), or the
    reference torch ops where it could not be generated."""
    if not epilogue:
        return out
    if g is None:
        return _epilogue.apply(epilogue, out, epilogue_args)
    from ...codegen import epilogue as gen

    return gen.apply_pointwise(g, out, epilogue_args)


def _ar_tma(graph: bool) -> str:
    """``knobs.symm.AR_TMA`` as it applies to an ``mm_ar`` call: "off" where its kernel's TMA staging does not
    (peer stores, the kernel's copy tiles: ``codegen/mm_rs.tma_ok``)."""
    peer = knobs.symm.TRANSPORT == "peer" and not graph
    return "off" if peer or knobs.symm.AR_KERNEL_COPY_OUT else knobs.symm.AR_TMA


def ar_candidates(dtype, rows: int, tma: str, measured=None, variants: bool | None = None) -> list:
    """The rounds kernel's tuning candidates for chunks of ``rows`` rows: its TMA variants where ``tma`` (``_ar_tma``)
    is on and BM divides the rows, only those with "only"; ``measured``, ``variants``: as ``configs.candidates``,
    a measured Gluon form where BM divides the rows whatever ``tma`` says (it stores by TMA, and only so)."""
    configs = load_kernels()[3]
    gluon = measured is not None and measured[6] in configs.GLUON_STORES
    cands = configs.candidates(dtype, tma_store_rows=rows if tma != "off" else None, variants=variants,
                               measured=None if gluon else measured)
    if gluon and dtype != torch.float32 and tuple(measured) not in cands and configs.fits(tuple(measured), None, rows):
        cands.append(tuple(measured))
    return ([c for c in cands if c[6]] or cands) if tma == "only" else cands


def _mm_ar_key(a, b, tma: str) -> tuple:
    return (a.shape[0], b.shape[1], a.shape[1], str(a.dtype), b.stride(0) == 1, f"tma={tma}")  # candidates differ


def _mm_ar_rounds_layout(M: int, ws: int) -> tuple[int, int]:
    """(rounds, rows per chunk and round) of ``mm_ar``'s rounds path."""
    rounds = ar_rounds(M, ws)
    return rounds, -(-M // (rounds * ws))


def _mm_ar_needs(a, b, ws: int) -> tuple[int, list]:
    """(data bytes, [the tuned config or None]) of an ``mm_ar`` call: what a captured call needs."""
    M, N, es = a.shape[0], b.shape[1], a.element_size()
    if M * N * es <= knobs.symm.ONESHOT_MAX_BYTES:
        return ws * M * N * es, []  # one-shot: no tuned kernel
    if ar_gemm(M, a.shape[1], ws, "ce", N=N, dtype=a.dtype) == "cublas":
        rounds = ar_cublas_rounds(M, a.shape[1], N, ws)
        return 2 * rounds * ws * -(-M // (rounds * ws)) * N * es, []  # no tuned kernel
    rounds, rows = _mm_ar_rounds_layout(M, ws)
    return 2 * rounds * ws * rows * N * es, [tuned_configs.get(("mm_ar", _mm_ar_key(a, b, _ar_tma(graph=True))))]


def _mm_ar_symm(st, a, b, bias, reduce_op, g=None, epilogue_args=(), graph=False):
    """(the all-reduced result, whether the epilogue ``g`` was applied in it: one-shot only)."""
    PATHS["mm_ar:symm"] += 1
    ws, r = st.ws, st.rank
    a, b, bias = tma_aligned(a), kernel_weight(b), (bias.contiguous() if bias is not None else None)
    M, N = a.shape[0], b.shape[1]
    es = a.element_size()
    base = layout.GRAPH_BLOCK if graph else 0
    if M * N * es <= knobs.symm.ONESHOT_MAX_BYTES:
        return _mm_ar_oneshot(st, a, b, bias, reduce_op == "avg", g, epilogue_args, graph), g is not None
    if ar_gemm(M, a.shape[1], ws, "ce" if graph else None, N=N, dtype=a.dtype) == "cublas":
        PATHS["mm_ar:symm:cublas"] += 1
        return mm_ar_cublas(st, a, b, bias, reduce_op == "avg", graph), False
    rounds, rows = _mm_ar_rounds_layout(M, ws)
    slot_bytes = rows * N * es
    region = rounds * ws * slot_bytes
    st.ensure_data(2 * region, "mm_ar")
    recv = st.data_view(a.dtype, (rounds * ws * rows, N))
    gather = st.data_view(a.dtype, (rounds * ws * rows, N), region)
    peer = peer_store_args(st, region) if knobs.symm.TRANSPORT == "peer" and not graph else None
    out = a.new_empty((M, N))
    stage = a.new_empty((rounds * ws * rows, N)) if peer is None else out

    copy_out = knobs.symm.AR_KERNEL_COPY_OUT
    host_copies = () if copy_out else range(1, ws)  # (with copy_out, the kernel's copy tiles do it)

    def launch(cfg, epoch, peer, stage):
        launch_rs_kernel(st, a, b, bias, stage, recv, gather, out, epoch, rows, rows, rounds, ws * rows, r * rows,
                         reduce_op == "avg", cfg, peer, base=base, copy_out=copy_out)

    tma = _ar_tma(graph)
    key = _mm_ar_key(a, b, tma)
    cands = ar_candidates(a.dtype, rows, tma, kernel_ratios.measured_variant("mm_ar", a.shape[0], a.shape[1], N,
                                                                              ws=ws, dtype=a.dtype))
    cfg = tuned_configs.get(("mm_ar", key)) or tune(
        "mm_ar", key, cands, lambda cfg: launch(cfg, 0, None, stage if peer is None else torch.empty_like(recv)))
    if cfg[6]:
        PATHS["mm_ar:symm:triton-tma"] += 1
    preload_once(("mm_ar", key, cfg, base, r, ws, st.timeout_ns, peer is None, copy_out, aligned([bias])),
                 lambda: launch(cfg, 0, peer, stage))
    compute = compute_stream(st, graph)
    epoch = st.begin(compute, "mm_ar", graph=graph)
    launch(cfg, epoch, peer, stage)
    gather_base = st.data_addr(r, region)
    row_bytes = N * es
    band_list = layout.bands(rows)
    nb = len(band_list)
    for rnd in range(rounds):
        # reduce-scatter: this rank's partials of the chunks peers own
        for pos in range(ws - 1 if peer is None else 0):
            c = (r + 1 + pos) % ws
            slot = rnd * ws + c
            stream = st.push_stream_to(c)
            for b, (lo, n) in enumerate(band_list):
                st.stream_wait(base + layout.DONE + slot * nb + b, epoch, stream, nb)
                st.push(c, (rnd * ws + r) * slot_bytes + lo * row_bytes,
                        stage.data_ptr() + (slot * rows + lo) * row_bytes, n * row_bytes,
                        layout.RS_ARRIVED + (rnd * ws + r) * nb + b, stream)
        own = rnd * ws + r
        for b, (lo, n) in enumerate(band_list if peer is None else ()):  # all-gather: reduced bands, to every peer
            wait_on_push_streams(st, base + layout.DONE + own * nb + b, epoch, nb)
            for j in range(1, ws):
                st.push((r - j) % ws, region + own * slot_bytes + lo * row_bytes,
                        gather_base + own * slot_bytes + lo * row_bytes, n * row_bytes, layout.GATHERED + own * nb + b,
                        st.push_stream_to((r - j) % ws))
        for j in host_copies:  # copy the peers' reduced bands out of the receive buffer
            q = (r + j) % ws
            for b, (lo, n) in enumerate(band_list):
                first = (rnd * ws + q) * rows + lo
                count = min(n, M - first)
                st.stream_wait(base + layout.GATHERED + (rnd * ws + q) * nb + b, epoch, st.copy_stream, nb)
                if count > 0:
                    _cuda.memcpy_async(out[first].data_ptr(),
                                       gather_base + (rnd * ws + q) * slot_bytes + lo * row_bytes,
                                       count * row_bytes, st.copy_stream)
    st.end(compute)
    return out, False


def ar_gemm(M: int, K: int, ws: int, transport: str | None = None, *, N: int = 0, dtype="bfloat16",
            gpu: str | None = None) -> str:
    """How ``mm_ar``'s rounds path computes: where the rounds kernel measured slower than
    ``knobs.symm.CUBLAS_ABOVE_RATIO`` times cuBLAS near this GEMM on this GPU (with ``N``), "cublas" unless
    this cuBLAS path measured slower still; "triton" where the path measured slower than the kernel
    (``kernel_ratios.measured_choice``); else where ``mm_rs`` would and the kernel would run one round, else
    "triton". Measured on 2xH200 (bench/probes/probe_symm.py,
    bench/results/collective_gemm_h200x2_2026-11-30/mm_rs_cublas, K=7168 N=8192, back to back): M=1024
    (one round) cuBLAS 0.570 ms vs kernel 0.782; but M=4096: 0.898-0.956 vs 0.834 and M=8192:
    1.738-1.764 vs 1.666, where the kernel's four rounds hide the all-gather and cuBLAS rounds cost host
    time."""
    measured = N and kernel_ratios.kernel_loses("mm_ar", M, K, N, ws=ws, dtype=dtype, gpu=gpu) is not None
    choice = kernel_ratios.measured_choice("mm_ar", M, K, N, ws=ws, dtype=dtype, gpu=gpu) if N else None
    if choice == "cublas" and knobs.symm.MM_RS_GEMM == "cublas" and (transport or knobs.symm.TRANSPORT) == "ce":
        return "cublas"
    if choice == "triton" or ar_rounds(M, ws) > 1:
        return "triton"
    # (the one-round kernel is mm_rs's: its ratios stand in where the rounds kernel was not measured)
    return rs_gemm(1, -(-M // ws), K, transport, N=0 if measured else N, ws=ws, dtype=dtype, gpu=gpu)


def ar_cublas_rounds(M: int, K: int, N: int, ws: int) -> int:
    """Row blocks of ``mm_ar``'s cuBLAS path: as for the kernel (``ar_rounds``), but with chunks of
    at least ``knobs.symm.RS_CUBLAS_BAND_FLOPS`` of GEMM work (each round costs host time, as a band
    does)."""
    return max(1, min(layout.AR_MAX_ROUNDS, M // (ws * cublas_min_rows(K, N))))


def mm_ar_cublas(st, a, b, bias, average, graph=False) -> Tensor:
    """``mm_ar``'s rounds on cuBLAS (see ``knobs.symm.MM_RS_GEMM``): the all-reduced [M, N].

    Per round t (``ar_cublas_rounds``; chunk c of round t is rows ``(t * ws + c) * rows`` on, one
    band each): the peers' chunks first, each GEMM into ``stage`` then raising its done flag, the
    push stream shipping it to its owner as in ``mm_rs``; then the own chunk's partial goes into
    the receive slot before waiting for the peers', so that it overlaps their transfers (as
    ``mm_rs_cublas`` does for a chunk of one band), and one summing kernel reduces the slots into
    ``out``; a stream write raises its done flag and the push stream sends those rows of ``out`` to
    every peer's gather region (the all-gather), while the next round computes; the copy stream
    copies the peers' reduced chunks into ``out`` as their flags rise. ``graph``: a call being
    captured (the flag block ``GRAPH_BLOCK``)."""
    ws, r = st.ws, st.rank
    base = layout.GRAPH_BLOCK if graph else 0
    M, K, N = a.shape[0], a.shape[1], b.shape[1]
    es = a.element_size()
    rounds = ar_cublas_rounds(M, K, N, ws)
    rows = -(-M // (rounds * ws))
    slot_bytes, row_bytes = rows * N * es, N * es
    region = rounds * ws * slot_bytes
    st.ensure_data(2 * region, "mm_ar")
    recv = st.data_view(a.dtype, (rounds * ws * rows, N))
    gather_base = st.data_addr(r, region)
    stage = a.new_empty((rounds * ws * rows, N))
    out = a.new_empty((M, N))
    peers = [(r + p) % ws for p in range(1, ws)]

    def rows_of(slot):  # (first row of a, rows) of chunk ``slot`` = t * ws + c
        return slot * rows, max(0, min(rows, M - slot * rows))

    compute = compute_stream(st, graph)
    epoch = st.begin(compute, "mm_ar", graph=graph)
    for t in range(rounds):
        for pos in range(ws - 1):  # reduce-scatter: this rank's partials of the chunks peers own
            c = (r + 1 + pos) % ws
            slot = t * ws + c
            lo, n = rows_of(slot)
            if n:
                matmul_into(a[lo : lo + n], b, bias, stage[lo : lo + n])
            _cuda.write_value32(st.flag_addr(base + layout.DONE + slot), epoch, compute)
            st.stream_wait(base + layout.DONE + slot, epoch, st.push_stream_to(c))
            st.push(c, (t * ws + r) * slot_bytes, stage.data_ptr() + lo * row_bytes, n * row_bytes,
                    layout.RS_ARRIVED + t * ws + r, st.push_stream_to(c))
        own = t * ws + r
        lo, n = rows_of(own)
        slots = recv.view(rounds, ws, rows, N)[t, :, :n]
        if n:  # the own partial overlaps the peers' transfers
            matmul_into(a[lo : lo + n], b, bias, slots[r])
        for p in peers:
            st.stream_wait(base + layout.RS_ARRIVED + t * ws + p, epoch, compute)
        reduce_slots(slots, out[lo : lo + n], 0, n, average)
        _cuda.write_value32(st.flag_addr(base + layout.DONE + own), epoch, compute)
        wait_on_push_streams(st, base + layout.DONE + own, epoch)
        for j in range(1, ws):  # all-gather: the reduced chunk, to every peer
            st.push((r - j) % ws, region + own * slot_bytes, out.data_ptr() + lo * row_bytes, n * row_bytes,
                    layout.GATHERED + own, st.push_stream_to((r - j) % ws))
        for q in peers:  # the peers' reduced chunks, out of the gather region as they arrive
            qlo, qn = rows_of(t * ws + q)
            st.stream_wait(base + layout.GATHERED + t * ws + q, epoch, st.copy_stream)
            if qn:
                _cuda.memcpy_async(out.data_ptr() + qlo * row_bytes, gather_base + (t * ws + q) * slot_bytes,
                                   qn * row_bytes, st.copy_stream)
    st.end(compute)
    return out


ONESHOT_SUMS = ("auto", "triton", "torch")


def oneshot_sum(M: int, N: int, ws: int, epilogue: bool = False, *, dtype="bfloat16", gpu: str | None = None) -> str:
    """How ``mm_ar`` one-shot sums the ws partials of an [M, N] output: "torch" (stream waits on the peers'
    arrival flags, then ``torch.sum`` over the slots) or "triton" (the sum kernel, spinning on the flags).
    ``knobs.symm.ONESHOT_SUM``: "auto" takes torch where the one-shot kernel measured slower than
    ``knobs.symm.CUBLAS_ABOVE_RATIO`` times ``torch.sum`` near this shape on this GPU (``spec/kernel_ratios.py``,
    kernel "oneshot", ``K`` = 1). A generated ``epilogue`` runs in the kernel's tiles, so it keeps the kernel.
    Depends only on shapes, dtype, the GPU's name, the ratio file and knobs, so every rank decides alike."""
    mode = knobs.symm.ONESHOT_SUM
    if mode not in ONESHOT_SUMS:
        raise ValueError(f"knobs.symm.ONESHOT_SUM = {mode!r}: expected one of {', '.join(ONESHOT_SUMS)}")
    if epilogue or mode == "triton":
        return "triton"
    if mode == "torch":
        return "torch"
    return "torch" if kernel_ratios.kernel_loses("oneshot", M, 1, N, ws=ws, dtype=dtype, gpu=gpu) else "triton"


def _mm_ar_oneshot(st, a, b, bias, average, g=None, epilogue_args=(), graph=False):
    PATHS["mm_ar:oneshot"] += 1
    if oneshot_sum(a.shape[0], b.shape[1], st.ws, g is not None, dtype=a.dtype) == "torch":
        return _mm_ar_oneshot_torch(st, a, b, bias, average, graph)
    _, _, reduce_kernel, _ = load_kernels()
    ws, r = st.ws, st.rank
    M, N = a.shape[0], b.shape[1]
    base = layout.GRAPH_BLOCK if graph else 0
    partial = torch.mm(a, b) if bias is None else torch.addmm(bias, a, b)
    nbytes = M * N * a.element_size()
    st.ensure_data(ws * nbytes, "mm_ar")
    recv = st.data_view(a.dtype, (ws * M, N))
    out = a.new_empty((M, N), dtype=_epilogue.out_dtype(g.spec, a.dtype) if g is not None else a.dtype)
    ep_ptrs = epilogue_pointers(g, epilogue_args)

    def launch(epoch):
        reduce_kernel.launch(partial, recv, out, st.flag_arg(base + layout.RS_ARRIVED), epoch, st.status_arg(),
                             st.timeout_ns, r, ws, average, epilogue=g, ep_ptrs=ep_ptrs)

    preload_once(("mm_ar:oneshot", M, N, a.dtype, base, r, ws, st.timeout_ns, average, id(g), aligned(ep_ptrs)),
                 lambda: launch(0))
    compute = compute_stream(st, graph)
    epoch = st.begin(compute, "mm_ar (one-shot)", graph=graph)
    for j in range(1, ws):
        st.push((r - j) % ws, r * nbytes, partial.data_ptr(), nbytes, layout.RS_ARRIVED + r,
                st.push_stream_to((r - j) % ws))
    launch(epoch)
    st.end(compute)
    return out


def _mm_ar_oneshot_torch(st, a, b, bias, average, graph=False) -> Tensor:
    """One-shot with the sum in torch: cuBLAS writes the partial straight into this rank's own slot of the
    receive region (peers push into theirs only), the copy engine pushes it to every peer under its arrival
    flag, the compute stream waits for every peer's flag by stream operations, and one ``torch.sum`` (``mean``
    for ``avg``) over the [ws, M, N] slots accumulates in float32 and rounds once, as the kernel does. Nothing
    follows the reads: as with the kernel, a peer pushes into these slots again only after this rank's next
    ``begin`` (its ``READY``), queued on the compute stream after the sum; captured, ``end`` resets the
    arrival flags (``GRAPH_RESET``)."""
    PATHS["mm_ar:oneshot:torch"] += 1
    ws, r = st.ws, st.rank
    M, N = a.shape[0], b.shape[1]
    base = layout.GRAPH_BLOCK if graph else 0
    nbytes = M * N * a.element_size()
    st.ensure_data(ws * nbytes, "mm_ar")
    slots = st.data_view(a.dtype, (ws, M, N))
    own = slots[r]
    matmul_into(a, b, bias, own)  # (before begin, like the kernel path's partial: no peer writes this slot)
    out = a.new_empty((M, N))
    compute = compute_stream(st, graph)
    epoch = st.begin(compute, "mm_ar (one-shot)", graph=graph)
    for j in range(1, ws):
        st.push((r - j) % ws, r * nbytes, own.data_ptr(), nbytes, layout.RS_ARRIVED + r,
                st.push_stream_to((r - j) % ws))
    for p in range(1, ws):
        st.stream_wait(base + layout.RS_ARRIVED + (r + p) % ws, epoch, compute)
    (torch.mean if average else torch.sum)(slots, dim=0, out=out)
    st.end(compute)
    return out


def _mm_ar_inputs(args) -> tuple[list, str]:
    a, b, bias, _, group_name, _, epilogue_args = args
    return [a, b, *([bias] if bias is not None else []), *epilogue_args], group_name


mm_ar.bind_key = lambda: private_graphs.KeyGraphs("mm_ar", mm_ar, _mm_ar_inputs)
