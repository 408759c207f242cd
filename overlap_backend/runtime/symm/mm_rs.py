"""The ``symm`` implementation of ``overlap::mm_rs`` (GEMM then reduce-scatter).

The chunks other ranks own are computed first; as each completes, the copy engine pushes it into its
owner's receive buffer; the own chunk comes last and adds the partials that arrived meanwhile (in
float32): no communication after the last GEMM. On cuBLAS a GEMM per band (``knobs.symm.MM_RS_GEMM``,
where ``rs_gemm`` allows it), else the persistent producer kernel, which reduces in its epilogue and
can store partials straight into the owners' buffers (``knobs.symm.TRANSPORT = "peer"``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ...spec import epilogue as _epilogue
from ...spec import kernel_ratios, knobs
from ...spec import symm_layout as layout
from .. import cuda as _cuda
from ..lowering import register
from ..ops import group_size
from . import private_graphs
from .lowering_helpers import (PATHS, aligned, capture_problem, compute_stream, preload_once, captured_call_problem,
                               capturing, call_state, epilogue_pointers, generated_epilogue, kernel_weight,
                               load_kernels, matmul_into, peer_slot_ranges, reduce_slots, run_on_p2p, tma_aligned,
                               tma_problem, tune, tuned_configs, zero_contraction)


def mm_problem(a, b, bias, reduce_op) -> str | None:
    """Why the kernels do not cover this ``mm_rs`` / ``mm_ar`` GEMM (None: they do)."""
    if a.device.type != "cuda":
        return "not a CUDA tensor"
    if reduce_op not in ("sum", "avg"):
        return f"reduce_op {reduce_op!r} (kernels: sum, avg)"
    if a.dim() != 2 or b.dim() != 2 or a.dtype != b.dtype:
        return f"operands {tuple(a.shape)} {a.dtype} @ {tuple(b.shape)} {b.dtype}"
    if bias is not None and bias.dim() != 1:
        return "bias is not a vector"
    return tma_problem(a.dtype, a.shape[1], b.shape[1])


def rs_gemm(outer: int, run: int, K: int, transport: str | None = None, *, N: int = 0, ws: int = 1,
            dtype="bfloat16", gpu: str | None = None) -> str:
    """How ``mm_rs`` computes a chunk of ``outer`` runs of ``run`` rows with ``K`` (local)
    contraction: "cublas" or "triton" (see ``knobs.symm.MM_RS_GEMM``). With ``N`` (and the group's
    ``ws``, the dtype): where the producer kernel measured slower than ``knobs.symm.CUBLAS_ABOVE_RATIO``
    times cuBLAS at the nearest measured shape on this GPU, the faster of the kernel and this cuBLAS path
    where the path was measured too, else "cublas"; where the kernel measured within it but faster than the
    path, "triton" (``kernel_ratios.measured_choice``); the shape rules elsewhere. Depends only on shapes,
    dtype, the GPU's name (``gpu``, default this process's), the ratio file and knobs, so every rank decides
    alike."""
    if knobs.symm.MM_RS_GEMM != "cublas" or (transport or knobs.symm.TRANSPORT) != "ce":
        return "triton"  # (peer stores come from the kernel)
    if outer > 1 and run < knobs.symm.RS_CUBLAS_MIN_RUN:
        return "triton"  # many tiny GEMMs: the kernel's row map
    choice = kernel_ratios.measured_choice("mm_rs", ws * outer * run, K, N, ws=ws, dtype=dtype, gpu=gpu) if N else None
    if choice is not None:
        return choice
    if K < knobs.symm.RS_CUBLAS_MIN_K or outer * run < knobs.symm.BAND_ROWS_MIN:
        return "triton"
    return "cublas"


def cublas_min_rows(K: int, N: int, captured: bool = False) -> int:
    """Rows of a cuBLAS-path band or chunk: each costs host time (~150 us), so at least
    ``RS_CUBLAS_BAND_FLOPS`` of GEMM work (``RS_CUBLAS_BAND_FLOPS_CAPTURED`` in a captured call, where
    it is set) and ``BAND_ROWS_MIN`` rows (``knobs.symm``)."""
    flops = knobs.symm.RS_CUBLAS_BAND_FLOPS
    if captured and knobs.symm.RS_CUBLAS_BAND_FLOPS_CAPTURED is not None:
        flops = knobs.symm.RS_CUBLAS_BAND_FLOPS_CAPTURED
    return max(knobs.symm.BAND_ROWS_MIN, math.ceil(flops / max(1, 2 * K * N)))


def rs_band_span(band: list[tuple[int, int, int]], run: int) -> tuple[int, int]:
    """(first local row, rows) of a band of ``rs_cublas_bands``: its pieces are consecutive rows."""
    return band[0][0] * run + band[0][1], sum(n for _, _, n in band)


def rs_cublas_bands(outer: int, run: int, K: int, N: int, captured: bool = False) -> list[list[tuple[int, int, int]]]:
    """The bands of the cuBLAS path over a chunk of ``outer`` runs of ``run`` rows of a [.., K] @
    [K, N] GEMM: each a list of (run index, first row, rows) pieces, one contiguous GEMM each,
    covering consecutive local rows (local row ``o * run + j``). At most ``MAX_BANDS`` bands of at
    least ``knobs.symm.BAND_ROWS_MIN`` rows and ``knobs.symm.RS_CUBLAS_BAND_FLOPS``; one run is cut into
    equal bands, several are grouped whole. ``captured``: for a call captured in a CUDA graph (every rank
    of the group captures it alike)."""
    min_rows = cublas_min_rows(K, N, captured)
    if outer == 1:
        nb = max(1, min(layout.MAX_BANDS, run // min_rows))
        per = max(1, -(-run // nb))
        return [[(0, lo, min(per, run - lo))] for lo in range(0, run, per)] or [[(0, 0, 0)]]
    per = max(-(-outer // layout.MAX_BANDS), -(-min_rows // run))
    per = -(-outer // -(-outer // per))  # the same number of bands, as even as they go
    return [[(o, 0, run) for o in range(o0, min(o0 + per, outer))] for o0 in range(0, outer, per)]


_plans: dict[tuple, tuple] = {}  # mm_rs_plan's decisions per call key


def mm_rs_plan(a, b, bias, out_shape, scatter_dim, reduce_op, group_name, graph) -> tuple:
    """What an ``mm_rs`` call of this key decides from shapes, dtypes and knobs (the same on every rank):
    (why not symm or None, scatter dim, rows per rank along it, run, outer, gemm, kernel candidates, RS_TMA).
    Made once per key."""
    key = (knobs.generation(), graph, a.shape, a.dtype, a.get_device(), b.shape, b.stride(), b.dtype,
           None if bias is None else bias.shape, tuple(out_shape), scatter_dim, reduce_op, group_name)
    plan = _plans.get(key)
    if plan is not None:
        return plan
    dim = scatter_dim % len(out_shape)
    why = mm_problem(a, b, bias, reduce_op) or capture_problem(a)
    if why is None and dim == len(out_shape) - 1:
        why = "scatter along the output's columns"
    seg = run = outer = gemm = cands = tma = None
    if why is None:
        configs = load_kernels()[3]
        ws = group_size(group_name)
        seg = out_shape[dim] // ws
        run = seg * math.prod(out_shape[dim + 1 : -1])
        outer = math.prod(out_shape[:dim])
        gemm = rs_gemm(outer, run, a.shape[1], "ce" if graph else None, N=b.shape[1], ws=ws, dtype=a.dtype)
        # TMA variants (codegen/mm_rs.py) where the transport is the copy engine and chunks are contiguous
        ce = graph or knobs.symm.TRANSPORT == "ce"
        # "off" where the variants do not apply, so that the tuning key (which names it) tells the cases apart: a
        # captured call's TMA config must not be reused by an eager call with peer stores
        tma = knobs.symm.RS_TMA if ce and outer == 1 else "off"
        cands = configs.candidates(a.dtype, None if outer == 1 else run,
                                   tma_store_rows=run if tma != "off" else None,
                                   measured=kernel_ratios.measured_variant("mm_rs", ws * outer * run, a.shape[1],
                                                                           b.shape[1], ws=ws, dtype=a.dtype))
        if tma == "only":
            cands = [c for c in cands if c[6]] or cands
        if gemm == "triton" and not cands:
            why = f"runs of {run} rows are not a multiple of any block height"
    if len(_plans) >= knobs.symm.MAX_PLANS:
        _plans.clear()
    plan = _plans[key] = (why, dim, seg, run, outer, gemm, cands, tma)
    return plan


@register("symm", "mm_rs")
def mm_rs(a, b, bias, out_shape, scatter_dim, reduce_op, group_name, epilogue="", epilogue_args=()):
    out_shape = list(out_shape)
    if b.shape[1] == 0:  # no output columns: nothing to reduce, nothing to send
        out = a.new_empty(_chunk_shape(out_shape, scatter_dim % len(out_shape), group_size(group_name)),
                          dtype=torch.result_type(a, b))
        return _epilogue.apply(epilogue, out, epilogue_args) if epilogue else out
    if a.shape[1] == 0:  # an empty contraction: (a @ b + bias) is bias or zeros, reduced over the ranks as usual
        a, b = zero_contraction(a, b)
    args = (a, b, bias, out_shape, scatter_dim, reduce_op, group_name, epilogue, epilogue_args)
    graph = a.is_cuda and capturing(a)
    why, dim, seg, run, outer, gemm, cands, tma = mm_rs_plan(a, b, bias, out_shape, scatter_dim, reduce_op,
                                                             group_name, graph)
    st = None
    if why is None:
        st, why = call_state(group_name, a.device, graph)
    if st is not None:
        ws = st.ws
        key = (a.shape[0], b.shape[1], a.shape[1], str(a.dtype), b.stride(0) == 1, run if outer > 1 else 0,
               f"tma={tma}")  # the candidates differ with knobs.symm.RS_TMA
        nbytes = ws * outer * run * b.shape[1] * a.element_size()
        tuned = [tuned_configs.get(("mm_rs", key))] if gemm == "triton" else []
        why = captured_call_problem(st, nbytes, tuned) if graph else None
    if st is None or why:
        return run_on_p2p("mm_rs", why, group_name, *args)
    PATHS["mm_rs:symm"] += 1
    PATHS[f"mm_rs:symm:{gemm}"] += 1
    ws = st.ws
    a, b, bias = tma_aligned(a), kernel_weight(b), (bias.contiguous() if bias is not None else None)
    N = b.shape[1]
    rows = outer * run
    chunk_bytes = rows * N * a.element_size()
    st.ensure_data(ws * chunk_bytes, "mm_rs")
    recv = st.data_view(a.dtype, (ws * rows, N))
    base = layout.GRAPH_BLOCK if graph else 0
    average = reduce_op == "avg"
    g = generated_epilogue(epilogue, a.dtype)
    chunk_shape = list(out_shape)
    chunk_shape[dim] = seg
    if gemm == "cublas":  # a generated epilogue runs in the kernel that reduces the partials
        out = mm_rs_cublas(st, a, b, bias, recv, outer, run, average, graph, g, epilogue_args).view(chunk_shape)
        return _epilogue.apply(epilogue, out, epilogue_args) if epilogue and g is None else out
    # captured calls ship by copy engine: peer stores wait for READY by epoch, inside the kernel
    peer = peer_store_args(st, 0) if knobs.symm.TRANSPORT == "peer" and not graph else None
    out = a.new_empty((rows, N), dtype=_epilogue.out_dtype(epilogue, a.dtype) if g is not None else a.dtype)
    stage = a.new_empty((ws * rows, N)) if peer is None else out
    ep_ptrs = epilogue_pointers(g, epilogue_args)

    def launch(cfg, epoch, peer, stage):
        launch_rs_kernel(st, a, b, bias, stage, recv, None, out, epoch, rows, run, 1, 0, 0, average, cfg, peer,
                         epilogue=g, ep_ptrs=ep_ptrs, base=base)

    # Tuning runs without communication: with the local staging transport even when peer stores are
    # on (a peer-store run at epoch 0 would write into peers' buffers while they may be reading them).
    cfg = tune("mm_rs", key, cands,
               lambda cfg: launch(cfg, 0, None, stage if peer is None else torch.empty_like(recv)))
    if cfg[6]:
        PATHS["mm_rs:symm:triton-tma"] += 1
    preload_once(("mm_rs", key, cfg, id(g), base, st.rank, ws, st.timeout_ns, peer is None,
                  aligned([bias, *epilogue_args])), lambda: launch(cfg, 0, peer, stage))
    compute = compute_stream(st, graph)
    epoch = st.begin(compute, "mm_rs", graph=graph)
    launch(cfg, epoch, peer, stage)
    if peer is None:
        push_partials(st, stage, rows, N, layout.bands(rows), epoch, base)
    st.end(compute)
    out = out.view(chunk_shape)
    return _epilogue.apply(epilogue, out, epilogue_args) if epilogue and g is None else out


def _chunk_shape(out_shape, dim: int, ws: int) -> list[int]:
    shape = list(out_shape)
    shape[dim] //= ws
    return shape


def push_partials(st, stage, rows, N, band_list, epoch, base):
    """Push stream: each band of each peer's chunk in ``stage`` [ws * rows, N], once its done flag
    is raised, into that peer's receive buffer, raising the peer's arrival flag."""
    ws, r = st.ws, st.rank
    row_bytes = N * stage.element_size()
    nb = len(band_list)
    for pos in range(ws - 1):
        c = (r + 1 + pos) % ws
        stream = st.push_stream_to(c)
        for b, (lo, n) in enumerate(band_list):
            st.stream_wait(base + layout.DONE + c * nb + b, epoch, stream, nb)
            st.push(c, r * rows * row_bytes + lo * row_bytes, stage.data_ptr() + (c * rows + lo) * row_bytes,
                    n * row_bytes, layout.RS_ARRIVED + r * nb + b, stream)


def mm_rs_cublas(st, a, b, bias, recv, outer, run, average, graph, epilogue=None, epilogue_args=()) -> Tensor:
    """The cuBLAS path of ``mm_rs`` (``knobs.symm.MM_RS_GEMM``): the reduced own chunk [outer * run, N],
    with the generated ``epilogue`` (``codegen/epilogue.py``; None: none) applied.

    Chunk c of ``a`` is ``a3[:, c]`` with ``a3 = a.view(outer, ws, run, K)``. Remote chunks first,
    band by band (``rs_cublas_bands``): each band's GEMMs write ``stage`` and a stream write raises
    its done flag; the push stream ships it as for the kernel (chunks of one run shorter than
    ``knobs.symm.RS_CUBLAS_MERGE_ROWS``: one GEMM per contiguous range of the peers' chunks instead).
    Then the own bands: a chunk of one
    band computes its own partial into the receive buffer's own slot while the transfer runs, then
    waits for the peers' and one kernel reduces the ws slots (in float32 for 16-bit types); with
    several bands each waits first (the peers' band arrived while the later remote bands computed),
    and at ws 2 without bias one ``addmm`` adds the peer's partial in cuBLAS's epilogue. Measured on
    2xH200, K=7168 N=8192 (bench/results/collective_gemm_h200x2_2026-11-30/graphs_own_first, run 6,
    replays / eager): one band own first 0.456 / 0.443 ms vs 0.478 / 0.477 waiting (M=4096), three bands
    waiting 0.842 / 0.829 vs 0.900 / 0.908 own first (M=8192). An ``epilogue`` runs in the reducing
    kernel (the generated ``reduce_kernel``; at ws 2 too, instead of ``addmm``): running the chunk on
    the Triton kernel to fuse it cost that kernel's slower GEMM (TP block training step under CUDA
    graphs 9.18 vs 8.78 ms unfused, 2xH200, bench/results/epilogue_h200x2_2026-11-30/cudagraphs)."""
    ws, r = st.ws, st.rank
    K, N = a.shape[1], b.shape[1]
    rows = outer * run
    base = layout.GRAPH_BLOCK if graph else 0
    a3 = a.view(outer, ws, run, K)
    slots = recv.view(ws, rows, N)
    recv4 = recv.view(ws, outer, run, N)
    stage = a.new_empty((ws * rows, N))
    stage4 = stage.view(ws, outer, run, N)
    out = a.new_empty((rows, N), dtype=_epilogue.out_dtype(epilogue.spec, a.dtype) if epilogue is not None else a.dtype)
    out3 = out.view(outer, run, N)
    ep_ptrs = epilogue_pointers(epilogue, epilogue_args)
    bands = rs_cublas_bands(outer, run, K, N, captured=graph)
    nb = len(bands)
    compute = compute_stream(st, graph)
    epoch = st.begin(compute, "mm_rs", graph=graph)
    if outer == 1 and nb == 1 and run < knobs.symm.RS_CUBLAS_MERGE_ROWS:
        for lo, hi in peer_slot_ranges(r, ws):  # short chunks: one GEMM per contiguous range of the peers'
            matmul_into(a[lo * run : hi * run], b, bias, stage[lo * run : hi * run])
            for c in range(lo, hi):
                _cuda.write_value32(st.flag_addr(base + layout.DONE + c), epoch, compute)
    else:
        for pos in range(ws - 1):
            c = (r + 1 + pos) % ws
            for i, band in enumerate(bands):
                for o, j, n in band:
                    matmul_into(a3[o, c, j : j + n], b, bias, stage4[c, o, j : j + n])
                _cuda.write_value32(st.flag_addr(base + layout.DONE + c * nb + i), epoch, compute)
    push_partials(st, stage, rows, N, [rs_band_span(band, run) for band in bands], epoch, base)
    own_first = nb == 1
    for i, band in enumerate(bands):
        if own_first:  # the own partial overlaps the transfer of the peers' (one band)
            for o, j, n in band:
                matmul_into(a3[o, r, j : j + n], b, bias, recv4[r, o, j : j + n])
        for p in range(1, ws):
            st.stream_wait(base + layout.RS_ARRIVED + (r + p) % ws * nb + i, epoch, compute, nb)
        for o, j, n in band:
            if epilogue is None and not own_first:
                reduce_own(a3[o, r, j : j + n], b, bias, recv4[:, o, j : j + n], r, out3[o, j : j + n], average)
                continue
            if not own_first:
                matmul_into(a3[o, r, j : j + n], b, bias, recv4[r, o, j : j + n])
            reduce_slots(slots, out, o * run + j, n, average, epilogue, ep_ptrs)
    st.end(compute)
    return out


def reduce_own(a, b, bias, slots, rank, out, average) -> None:
    """An own band that waited for the peers' partials first (one of several bands): ``out`` = the sum
    (``average``: mean) over ranks of their partials of these rows, this rank's ``a @ b (+ bias)`` and
    the peers' in ``slots`` [ws, rows, N] (slot ``rank`` is free). At ws 2 without bias one ``addmm``
    adds the peer's in cuBLAS's epilogue; otherwise the own partial goes into its slot and one kernel
    reduces the slots."""
    ws = slots.shape[0]
    scale = 1.0 / ws if average else 1.0
    if ws == 2 and bias is None:
        torch.addmm(slots[1 - rank], a, b, beta=scale, alpha=scale, out=out)
    else:
        matmul_into(a, b, bias, slots[rank])
        reduce_slots(slots, out, 0, out.shape[0], average)


def launch_rs_kernel(st, a, b, bias, stage, recv, gather, out, epoch, rows, run, rounds, out_round_stride, out_offset,
                     average, cfg, peer, epilogue=None, ep_ptrs=(), base=0, copy_out=False):
    """The mm_rs / mm_ar producer kernel on this group's counters, flags, ticket and status word
    (those of the flag block at ``base``: 0, or ``GRAPH_BLOCK`` for a captured call).
    ``copy_out`` (mm_ar): the kernel copies the peers' gathered bands into ``out`` itself."""
    _, rs_kernel, _, _ = load_kernels()
    rs_kernel.launch(a, b, bias, stage, recv, gather, out, st.flag_arg(base + layout.COUNTERS),
                     st.flag_arg(base + layout.DONE), st.flag_arg(base + layout.RS_ARRIVED),
                     st.flag_arg(base + layout.TICKET), epoch, st.status_arg(), st.timeout_ns,
                     st.rank, st.ws, rows, run, rounds, out_round_stride, out_offset, average, layout.band_rows(rows),
                     cfg, st.num_sms, peer=peer, epilogue=epilogue, ep_ptrs=ep_ptrs,
                     gathered=st.flag_arg(base + layout.GATHERED) if copy_out else None)



def peer_store_args(st, gather_offset: int) -> dict:
    """The kernel's arguments for storing into peers' buffers (``knobs.symm.TRANSPORT = "peer"``)."""
    data, flags = st.peer_tables()
    return dict(data=data, flags=flags, ready=st.flag_arg(layout.READY), gather_offset=gather_offset,
                rs_flag_word=layout.RS_ARRIVED, ag_flag_word=layout.GATHERED)


def _mm_rs_inputs(args) -> tuple[list, str]:
    a, b, bias, _, _, _, group_name, _, epilogue_args = args
    return [a, b, *([bias] if bias is not None else []), *epilogue_args], group_name


mm_rs.bind_key = lambda: private_graphs.KeyGraphs("mm_rs", mm_rs, _mm_rs_inputs)
