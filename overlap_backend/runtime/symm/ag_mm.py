"""The ``symm`` implementation of ``overlap::ag_mm``.

Every rank pushes its shard into each peer's receive buffer with the copy engine (to rank-1 first, so
that rank q receives chunk q+1, q+2, ... in that order, one sender at a time) while the GEMM starts
on the local shard and takes each chunk as its flag rises: on cuBLAS, a GEMM per chunk after a stream
wait (``knobs.symm.AG_MM_GEMM``), or the persistent consumer kernel, which waits per band tile by tile
and fuses generated epilogues.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ...spec import epilogue as _epilogue
from ...spec import kernel_ratios, knobs
from ...spec import symm_layout as layout
from ..lowering import register
from ..ops import group_size
from . import private_graphs
from .lowering_helpers import (PATHS, aligned, call_state, capture_problem, captured_call_problem, capturing,
                               compute_stream, epilogue_pointers, generated_epilogue, kernel_weight, load_kernels,
                               matmul_into, peer_slot_ranges, preload_once, run_on_p2p, tma_aligned, tma_problem,
                               tune, tuned_configs)


def ag_mm_problem(shard, weights, biases, gather_dim) -> str | None:
    """Why the kernels do not cover this ``ag_mm`` (None: they do)."""
    if shard.device.type != "cuda":
        return "not a CUDA tensor"
    if gather_dim % shard.dim() == shard.dim() - 1:
        return "gather along the contraction dim"
    for w in weights:
        if w.dim() != 2 or w.dtype != shard.dtype:
            return f"weight {tuple(w.shape)} {w.dtype} is not a 2-D {shard.dtype} matrix"
        if why := tma_problem(shard.dtype, shard.shape[-1], w.shape[1]):
            return why
    for bias in biases:
        if bias is not None and bias.dim() != 1:
            return "bias is not a vector"
    return None


_plans: dict[tuple, tuple] = {}  # ag_mm_plan's decisions per call key


def ag_mm_plan(st, shard, weights, epilogues, dim, graph) -> tuple:
    """What a call of this key decides from shapes, dtypes, strides and knobs (the same on every rank):
    (gemm, tile-config keys, generated epilogues, output dtypes, bands' rows). Made once per key."""
    key = (knobs.generation(), graph, shard.shape, shard.dtype, dim, tuple(epilogues),
           tuple([(w.shape, w.stride()) for w in weights]))
    plan = _plans.get(key)
    if plan is not None:
        return plan
    K = shard.shape[-1]
    rows = shard.numel() // K
    run = math.prod(shard.shape[dim:-1])
    outer = rows // run if run else 0
    N = sum(w.shape[1] for w in weights)
    gemm = ag_gemm(outer, run, K, N, bool(any(epilogues)), ws=st.ws, dtype=shard.dtype)
    specs = list(epilogues) or [""] * len(weights)
    # on cuBLAS the epilogues run after the GEMMs (ag_gemm chose so where fusing measured slower); on the kernel
    # too where the kernel plain and the epilogue after it measured faster than the epilogue fused
    apart = any(epilogues) and ag_epilogue_apart(outer, run, K, N, ws=st.ws, dtype=shard.dtype)
    fuse = gemm == "triton" and not apart
    gens = [generated_epilogue(spec, shard.dtype) if fuse else None for spec in specs]
    # an epilogue that casts to a narrower dtype may leave rows TMA cannot store: torch ops then
    gens = [None if g is not None and tma_problem(_epilogue.out_dtype(spec, shard.dtype), w.shape[1]) else g
            for g, spec, w in zip(gens, specs, weights)]
    # a fused GEMM tunes apart from the plain one of its shape: its candidates (the measured variant) and its best
    # config can differ
    keys = [(rows, w.shape[1], K, str(shard.dtype), w.stride(0) == 1, run == rows, g is not None)
            for w, g in zip(weights, gens)]
    # an output whose epilogue could not be generated is computed plainly, its reference applied after
    dtypes = [shard.dtype if spec and g is None else _epilogue.out_dtype(spec, shard.dtype)
              for spec, g in zip(specs, gens)]
    post = [spec if g is None else "" for spec, g in zip(specs, gens)] if any(
        spec and g is None for spec, g in zip(specs, gens)) else None
    # outputs that a swiglu step reads are computed first
    order = sorted(range(len(weights)), key=lambda i: bool(_epilogue.out_refs(specs[i])))
    if len(_plans) >= knobs.symm.MAX_PLANS:
        _plans.clear()
    plan = _plans[key] = (gemm, keys, gens, dtypes, post, order, rows, run, outer, layout.band_rows(rows))
    return plan


@register("symm", "ag_mm")
def ag_mm(shard, weights, biases, gather_dim, group_name, return_gathered, epilogues=(), epilogue_args=()):
    if shard.shape[-1] == 0 or any(w.shape[1] == 0 for w in weights):
        return ag_mm_empty(shard, weights, biases, gather_dim, group_name, return_gathered, epilogues, epilogue_args)
    args = (shard, weights, biases, gather_dim, group_name, return_gathered, epilogues, epilogue_args)
    why = ag_mm_problem(shard, weights, biases, gather_dim) or capture_problem(shard)
    graph = why is None and capturing(shard)
    st, why = (None, why) if why else call_state(group_name, shard.device, graph)
    if st is None:
        return run_on_p2p("ag_mm", why, group_name, *args)
    ag_kernel, _, _, configs = load_kernels()
    ws, r = st.ws, st.rank
    shard = tma_aligned(shard)
    dim = gather_dim % shard.dim()
    gemm, keys, gens, dtypes, post, order, rows, run, outer, band_rows = ag_mm_plan(st, shard, weights, epilogues,
                                                                                    dim, graph)
    K = shard.shape[-1]
    chunk_bytes = rows * K * shard.element_size()
    if graph:
        tuned = [tuned_configs.get(("ag_mm", k)) for k in keys] if gemm == "triton" else []
        if why := captured_call_problem(st, ws * chunk_bytes, tuned):
            return run_on_p2p("ag_mm", why, group_name, *args)
    PATHS["ag_mm:symm"] += 1
    PATHS[f"ag_mm:symm:{gemm}"] += 1
    if gemm == "triton" and post is not None:
        PATHS["ag_mm:symm:triton-epilogue-apart"] += 1
    st.ensure_data(ws * chunk_bytes, "ag_mm")
    buf = st.data_view(shard.dtype, (ws, rows, K))
    shard2d = shard.view(rows, K)
    weights = [kernel_weight(w) for w in weights]
    biases = [b.contiguous() if b is not None else None for b in (biases or [None] * len(weights))]
    outs = [shard.new_empty((ws * rows, w.shape[1]), dtype=dt) for w, dt in zip(weights, dtypes)]
    if return_gathered:
        gshape = list(shard.shape)
        gshape[dim] *= ws
        gathered = shard.new_empty(gshape)
    else:
        gathered = shard.new_empty((0,))
    base = layout.GRAPH_BLOCK if graph else 0
    flags, status = st.flag_arg(base + layout.AG_ARRIVED), st.status_arg()

    def launch(i, cfg, epoch, shard_in_buf=False):
        ag_kernel.launch(shard2d, buf, weights[i], biases[i], outs[i], flags, epoch, status, st.timeout_ns,
                         r, ws, run, band_rows, cfg, st.num_sms, epilogue=gens[i],
                         ep_ptrs=epilogue_pointers(gens[i], epilogue_args, outs), shard_in_buf=shard_in_buf)

    cfgs = [] if gemm == "cublas" else [
        tuned_configs.get(("ag_mm", keys[i])) or
        tune("ag_mm", keys[i], configs.candidates(
            shard.dtype, tma_store_rows=ag_kernel.tma_store_rows(rows, ws) if run == rows else None,
            measured=kernel_ratios.measured_variant("ag_mm", ws * rows, K, weights[i].shape[1], ws=ws,
                                                    dtype=shard.dtype, fused=gens[i] is not None)),
             lambda cfg, i=i: launch(i, cfg, 0))
        for i in range(len(weights))
    ]
    # compile and load before anything waits on a peer (codegen/launcher.py); once per variant
    preload_once(("ag_mm", tuple(keys), run, tuple(cfgs), tuple(map(id, gens)), base, r, ws, st.timeout_ns,
                  aligned(biases), aligned(epilogue_args)),
                 lambda: [launch(i, cfgs[i], 0) for i in range(len(cfgs))])
    compute = compute_stream(st, graph)
    epoch = st.begin(compute, "ag_mm", graph=graph)
    # the cuBLAS path waits for whole chunks: one copy and one flag per peer, not one per band
    nbands = push_shard(st, shard2d, whole=gemm == "cublas")
    if gemm == "cublas":
        ag_mm_cublas(st, shard2d, buf, weights, biases, outs, outer, run, epoch, base, nbands, compute)
    for n, i in enumerate(order if cfgs else ()):
        launch(i, cfgs[i], epoch, shard_in_buf=n > 0)  # (decode sizes: the first copies the own shard into buf)
    if return_gathered and rows:
        # strided copies on the copy stream (SM kernels). Copy-engine 2-D copies (cuMemcpy2DAsync) were
        # measured slower end to end: TP block training step 11.77 vs 10.34 ms on 2xH200 (bench_epilogue,
        # 2026-11-30), although the copies themselves took less time; why is not known
        gview = gathered.view(outer, ws, run, K)
        with torch.cuda.stream(st.copy_stream):
            gview[:, r].copy_(shard2d.view(outer, run, K))
            for j in range(1, ws):
                c = (r + j) % ws
                # bands are pushed in order on one stream: the last band's flag covers the chunk
                st.stream_wait(base + layout.AG_ARRIVED + c * nbands + nbands - 1, epoch, st.copy_stream, nbands)
                gview[:, c].copy_(buf[c].view(outer, run, K))
    st.end(compute)
    if post is not None:
        outs = _epilogue.apply_all(post, outs, epilogue_args)
    return gathered, outs


def ag_mm_empty(shard, weights, biases, gather_dim, group_name, return_gathered, epilogues, epilogue_args):
    """``ag_mm`` with an empty contraction (K = 0) or weights without columns (N = 0), as eager computes it.
    K = 0 sends nothing: the gathered tensor has no elements and each output is its bias (or zeros)
    broadcast over the rows. Outputs of N = 0 are empty; the other outputs (and the gathered tensor)
    come from the usual path. Epilogues run as their reference (torch ops) on the whole list."""
    ws = group_size(group_name)
    dim = gather_dim % shard.dim()
    gshape = list(shard.shape)
    gshape[dim] *= ws
    rows = math.prod(gshape[:-1])
    biases = list(biases) if biases else [None] * len(weights)
    if gshape[-1] == 0:
        gathered = shard.new_empty(gshape) if return_gathered else shard.new_empty((0,))
        outs = [b.expand(rows, w.shape[1]).clone() if b is not None else shard.new_zeros((rows, w.shape[1]))
                for w, b in zip(weights, biases)]
    else:
        keep = [i for i, w in enumerate(weights) if w.shape[1] > 0]
        gathered, kept = shard.new_empty((0,)), []
        if keep or return_gathered:  # (no weight left: the path only gathers)
            gathered, kept = ag_mm(shard, [weights[i] for i in keep], [biases[i] for i in keep], gather_dim,
                                   group_name, return_gathered)
        outs = [shard.new_empty((rows, 0)) for _ in weights]
        for i, out in zip(keep, kept):
            outs[i] = out
    return gathered, _epilogue.apply_all(list(epilogues), outs, epilogue_args)


def push_shard(st, shard2d: Tensor, whole: bool = False) -> int:
    """Push stream(s): this rank's shard [rows, K], band by band (``symm_layout.bands``), into slot
    ``rank`` of every peer's receive buffer, raising the peer's AG_ARRIVED flag of each band; rank r
    pushes to r-1 first, then r-2, ... (on one stream; or at once, ``knobs.symm.PUSH_STREAM_PER_PEER``:
    either way a peer's bands go in order on one stream). ``whole``: the chunk as one band (for readers that
    wait for whole chunks; each band costs a copy and a flag write of host time). Returns the number of
    bands per chunk."""
    ws, r = st.ws, st.rank
    rows, K = shard2d.shape
    row_bytes = K * shard2d.element_size()
    band_list = [(0, rows)] if whole else layout.bands(rows)
    nbands = len(band_list)
    for j in range(ws - 1):
        peer = (r - 1 - j) % ws
        for b, (lo, n) in enumerate(band_list):
            st.push(peer, r * rows * row_bytes + lo * row_bytes, shard2d.data_ptr() + lo * row_bytes,
                    n * row_bytes, layout.AG_ARRIVED + r * nbands + b, st.push_stream_to(peer))
    return nbands


def ag_gemm(outer: int, run: int, K: int, N: int, epilogue: bool = False, *, ws: int = 0,
            dtype="bfloat16", gpu: str | None = None) -> str:
    """How ``ag_mm`` computes a gathered [outer, ws * run, K] @ [K, N] (``N``: all its weights'
    columns): "cublas" or "triton" (see ``knobs.symm.AG_MM_GEMM``). With ``ws``, where measured near this GEMM on
    this GPU (``kernel_ratios.measured_choice``: the consumer kernel against cuBLAS, with a fused ``epilogue``
    against cuBLAS plus the separate epilogue kernel, which then runs after the GEMMs; the cuBLAS path, a GEMM
    per chunk, against one GEMM), the measurements decide; elsewhere the rules below. Depends only on shapes,
    dtype, the GPU's name, the ratio file and knobs, so every rank decides alike."""
    if knobs.symm.AG_MM_GEMM != "cublas":
        return "triton"
    if outer > 1 and run < knobs.symm.AG_CUBLAS_MIN_RUN:  # one GEMM per (outer index, chunk): too many tiny ones
        return "triton"
    choice = ws and kernel_ratios.measured_choice("ag_mm", ws * outer * run, K, N, ws=ws, dtype=dtype, fused=epilogue,
                                                 gpu=gpu)
    if epilogue or N < knobs.symm.AG_CUBLAS_MIN_N:  # generated epilogues are fused into the kernel's tiles
        return choice or "triton"
    return choice or "cublas"


def ag_epilogue_apart(outer: int, run: int, K: int, N: int, *, ws: int, dtype="bfloat16",
                      gpu: str | None = None) -> bool:
    """Whether ``ag_mm`` on its kernel runs its generated epilogues apart, after the kernel (``post``), instead of
    in the kernel's tiles: where the kernel benchmark measured that faster near this GEMM on this GPU
    (``kernel_ratios.fuses_epilogue``; ``N``: all the weights' columns). Alike on every rank."""
    return bool(ws) and kernel_ratios.fuses_epilogue("ag_mm", ws * outer * run, K, N, ws=ws, dtype=dtype,
                                                      gpu=gpu) is False


def ag_mm_cublas(st, shard2d, buf, weights, biases, outs, outer, run, epoch, base, nbands, compute) -> None:
    """``ag_mm``'s cuBLAS path (``knobs.symm.AG_MM_GEMM``): each output's rows of the own chunk first, from
    the shard itself, while the copy engine brings the peers' shards; then each peer's chunk in the order
    they arrive (rank r receives r+1's first: every rank pushes to r-1 first), each after a stream
    wait on its last band's flag (bands are pushed in order on one stream). Chunk c of an output is
    ``out.view(outer, ws, run, N)[:, c]``: one GEMM per outer index. Chunks of fewer rows than
    ``knobs.symm.AG_CUBLAS_MERGE_ROWS`` (outer 1): after the own chunk's, one GEMM per contiguous range of the peers'
    slots once they all arrived."""
    ws, r, K = st.ws, st.rank, shard2d.shape[1]
    if outer == 1:  # contiguous chunks: plain row slices (a tensor index costs a few us of host time each)
        # short chunks: the peers' in as few GEMMs as their slots allow, once all arrived (knobs.symm)
        merge = run < knobs.symm.AG_CUBLAS_MERGE_ROWS
        for p in range(ws):
            c = (r + p) % ws
            if p:
                st.stream_wait(base + layout.AG_ARRIVED + c * nbands + nbands - 1, epoch, compute, nbands)
            if p and merge:
                continue
            src = shard2d if c == r else buf[c]
            for w, bias, out in zip(weights, biases, outs):
                matmul_into(src, w, bias, out[c * run:(c + 1) * run])
        if merge:
            for lo, hi in peer_slot_ranges(r, ws):
                src = buf[lo:hi].view((hi - lo) * run, K)
                for w, bias, out in zip(weights, biases, outs):
                    matmul_into(src, w, bias, out[lo * run:hi * run])
        return
    outs4 = [o.view(outer, ws, run, o.shape[1]) for o in outs]
    for p in range(ws):
        c = (r + p) % ws
        if p:
            st.stream_wait(base + layout.AG_ARRIVED + c * nbands + nbands - 1, epoch, compute, nbands)
        src = (shard2d if c == r else buf[c]).view(outer, run, K)
        for w, bias, out4 in zip(weights, biases, outs4):
            for o in range(outer):
                matmul_into(src[o], w, bias, out4[o, c])


def _ag_mm_inputs(args) -> tuple[list, str]:
    shard, weights, biases, _, group_name, _, _, epilogue_args = args
    return [shard, *weights, *[b for b in biases or () if b is not None], *epilogue_args], group_name


ag_mm.bind_key = lambda: private_graphs.KeyGraphs("ag_mm", ag_mm, _ag_mm_inputs)
