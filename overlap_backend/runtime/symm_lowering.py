"""The ``symm`` implementations of ``overlap::ag_mm``, ``mm_rs`` and ``mm_ar`` (see ``symm.py``).

- ``ag_mm``: every rank pushes its shard into each peer's receive buffer with the copy engine
  (to rank-1 first, so that rank q receives chunk q+1, q+2, ... in that order, one sender at a time)
  while the persistent GEMM starts on the local shard and takes each chunk as its flag rises.
- ``mm_rs``: the persistent GEMM computes the chunks other ranks own first; as each completes, the
  copy engine pushes it into its owner's receive buffer; the own chunk comes last and its epilogue
  adds the partials that arrived meanwhile (in float32): no communication after the last tile.
- ``mm_ar``: the same reduce-scatter over ``rounds`` row blocks; each round's reduced chunk is pushed
  to every peer while the next round computes, and copied out of the receive buffer on arrival.
  Up to ``ONESHOT_MAX_BYTES`` of partial: one-shot (cuBLAS partial, pushed whole to every peer,
  summed by one small kernel).

What the kernels do not cover falls back to ``p2p`` (the decision depends only on shapes, dtypes
and the op's arguments, so it is the same on every rank).
"""

from __future__ import annotations

import logging
import math
from collections import Counter

import torch
from torch import Tensor

from ..codegen import launcher
from . import cuda as _cuda
from ..spec import epilogue as _epilogue
from . import symm
from .lowering import implementation, register
from .ops import _group_size

log = logging.getLogger("overlap_backend.symm")

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_logged: set[tuple[str, str]] = set()
# How mm_rs / mm_ar ship partials and reduced chunks: "ce" (the copy engine: stage, then the host
# queues cuMemcpyAsync per band) or "peer" (the kernel's epilogue stores into the owner's buffer and
# raises its flag). The same on every rank (a module setting, not a tuning result); bench/ compares.
TRANSPORT = "ce"
# How mm_rs computes its partials: "cublas" (one cuBLAS GEMM per band, remote bands first, each
# raising its done flag by a stream write; then the own bands, and a summing kernel per band once
# the peers' partials arrived: RS_OWN_FIRST) or "triton" (the persistent producer kernel,
# which reduces in its epilogue). Both ship partials by copy engine under the same flags.
# "cublas" is taken where ``rs_gemm`` allows it. Measured on 2xH200 (bench/probe_symm.py, ninth
# session, bench/results/2026-11-30_h200x2_session9): on the GPU the two are alike (CUDA-graph
# replays, K=7168 N=8192, M=4096: kernel 0.416-0.441 ms, cuBLAS 0.419-0.480 by band count;
# M=8192: 0.847-0.917 vs 0.853-0.935), the kernel ahead where the transfer dominates (K=2048
# M=16384: 0.588-0.637 vs 0.592-0.662) and at M=512 (0.085 vs 0.086-0.102). Eager calls are
# host-bound and the cuBLAS path costs less host time: back to back 0.470-0.510 vs 0.483-0.738
# at M=4096, 0.817-0.826 vs 0.846-0.856 at M=8192 (four runs). Hence: calls with at least
# RS_CUBLAS_MIN_K of local K and BAND_ROWS_MIN rows per chunk on cuBLAS, the rest on the kernel.
# Captured calls take the same path as the eager calls that warm them up: those tuned no kernel
# config for the shape, and a captured call cannot tune (its cuBLAS path passed the GPU capture
# test; in replays it is within a few percent of the kernel, above).
MM_RS_GEMM = "cublas"
RS_CUBLAS_MIN_K = 2048
RS_CUBLAS_MIN_RUN = 128  # chunks made of runs shorter than this (many tiny GEMMs) stay on the kernel
# Each band of the cuBLAS path costs host time (views, a GEMM, stream writes and waits, a copy:
# ~150 us measured), so bands are at least this much GEMM work (M=4096: one band, 0.470-0.510 ms
# back to back, vs four bands of 512 rows, 0.696-0.899).
RS_CUBLAS_BAND_FLOPS = 64e9
# A captured call pays no host time per band, and a finer first band starts the transfer earlier:
# replayed at 2 GPUs (bench/probe_symm.py, ninth session) 32 GFLOP bands took 0.434 ms at M=4096
# (0.476 with one band) and 0.634 at M=16384, K=2048 (0.681 with 64 GFLOP bands), but 0.953 at
# M=8192 (0.862 with 64). None: captured calls take RS_CUBLAS_BAND_FLOPS too; probe_symm --ops mm_rs
# sweeps this setting replayed.
RS_CUBLAS_BAND_FLOPS_CAPTURED: float | None = None
# Where a chunk is ONE band (mm_rs; every round of mm_ar), the cuBLAS paths compute the own
# partial before waiting for the peers' (into the receive buffer's own slot, then one kernel
# reduces the slots), so that it overlaps the transfer, which only starts once the remote band's
# GEMM is done. With several bands each own band waits first (the peers' band arrived while the
# later remote bands computed) and, at ws 2 without bias, one addmm adds the peer's partial in
# cuBLAS's epilogue, which saves the summing pass. Measured on 2xH200 (fourteenth session, run 6,
# same host, CUDA-graph replays / eager, K=7168 N=8192): mm_rs M=4096 (one band) 0.456 / 0.443 ms
# own first vs 0.478 / 0.477 waiting; M=8192 (three bands) 0.900 / 0.908 vs 0.842 / 0.829;
# mm_ar M=1024 (one round) 0.258 vs 0.278 replayed. False: every band waits first.
RS_OWN_FIRST = True
# The mm_rs kernel's TMA variants (codegen/mm_rs.py: staged and output tiles stored by TMA, staged
# tiles counted in batches a main loop later, the peers' partials loaded by TMA), where they apply
# (tma_ok): True: tuning candidates next to the pointer-store configs; "only": the only candidates
# (tests); False: pointer stores only. Measured alone on one H200 (bench/probe_ws.py --mm-rs,
# seventeenth session, run 10, ms, pointer / TMA): ws 4's local 16384x512x8192 0.378 / 0.319,
# 4096x1792x8192 0.206 / 0.198, ws 2's 16384x1024x8192 0.489 / 0.443 and 8192x3584x8192 0.688 / 0.720
# (the tuner keeps the faster). On since the multi-rank GPU tests pass with it (tests/gpu/test_gpu.py,
# lowering "symm-rstma", where the copy engine reads what the TMA stores wrote): ranks sharing one
# H200 (OVERLAP_TEST_SHARED_GPU, eighteenth session) at 2, 4 and 8 ranks, op numerics and 100
# repeated calls. Not yet timed in the op on several GPUs.
RS_TMA: bool | str = True
# mm_ar's rounds kernel copies the peers' reduced bands from the gather region into the output itself
# (copy tiles, codegen/mm_rs.py COPY_OUT), instead of the host queueing cuMemcpyAsync on the copy
# stream: a copy within one GPU runs on the SMs (bench/probe_copy_sms.py), so those copies could not
# start before the kernel's last tile and left the whole copy-out after it. Correct under the
# interpreter (tests/kernels/test_tile_kernels.py); off until it is timed on several GPUs.
AR_KERNEL_COPY_OUT = False
# How ag_mm computes: "cublas" (one cuBLAS GEMM per chunk and weight, the own chunk first while the
# copy engine brings the peers' shards, each peer chunk after a stream wait on its arrival flag:
# _ag_mm_cublas) or "triton" (the persistent consumer kernel, which waits per band tile by tile and
# fuses generated epilogues). "cublas" is taken where ``ag_gemm`` allows it: outputs without a generated
# epilogue, at least AG_CUBLAS_MIN_N columns in all, and (gathers along an inner dimension) chunks made of
# runs of at least AG_CUBLAS_MIN_RUN rows.
# Measured on 2xH200 (probe_symm --ops ag_mm, sixteenth session; back to back / CUDA-graph replays, ms):
# 4096x8192x7168 cuBLAS 0.728 / 0.886 vs kernel 0.746 / 0.752; 8192x8192x7168 1.482 / 1.444 vs
# 1.488 / 1.588; 16384x8192x2048 0.834 / 0.971 vs 0.863 / 0.852; the Llama step's MLP up-projection
# (8192x4096, two weights of 7168) 1.511 / 1.494 vs 1.577 / 1.697 and its QKV (three of 1024)
# 0.369 / 0.332 vs 0.485 / 0.403; M=512 0.233 / 0.118 vs 0.278 / 0.140.
AG_MM_GEMM = "cublas"
AG_CUBLAS_MIN_N = 0
AG_CUBLAS_MIN_RUN = 128
_picked: dict[tuple, tuple] = {}  # (kernel, shape key) -> block config, without configs.pick's lookups
PATHS: Counter = Counter()  # "op:symm" / "op:p2p" calls of this process (tests check the path taken)


def _p2p(op: str, why: str | None, group_name: str, *args):
    """Run ``op`` on the p2p lowering; ``why`` None means the group's symm setup failed."""
    why = why or symm._fallback.get(group_name, "symmetric-memory setup failed")
    PATHS[f"{op}:p2p"] += 1
    if (op, why) not in _logged:
        _logged.add((op, why))
        log.info("overlap symm: %s runs on p2p: %s", op, why)
    return implementation("p2p", op)(*args)


# Calls made while a CUDA graph is captured: True runs them on symm with the toggling flag block
# (symm.GRAPH_BLOCK: no epoch from the host, which a replay would repeat); False runs them on p2p,
# whose NCCL calls are captured. On since the captured path passed on 2xH200 (2026-11-30:
# tests/gpu/test_gpu.py -k captured_symm, 12 replays of ag_mm, mm_rs, mm_ar one-shot and in rounds
# interleaved with eager calls; -k reduce_overhead on the TP models).
CAPTURE_ON_SYMM = True
CAPTURE_WHY = ("inside a CUDA-graph capture (symm_lowering.CAPTURE_ON_SYMM is off); p2p's NCCL calls are "
               "captured")


def capturing(t: Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def capture_problem(t: Tensor) -> str | None:
    """Why a call being captured into a CUDA graph cannot take the symm path (None: it can, or it is
    not being captured). Every rank of a group captures the same graph, so the decision is the same
    on every rank."""
    return CAPTURE_WHY if capturing(t) and not CAPTURE_ON_SYMM else None


def _state(group_name: str, device: torch.device, graph: bool) -> tuple[symm.GroupState | None, str | None]:
    """The group's symm state, or (None, why not). A captured call only uses a state that eager
    calls set up before (setting one up is collective and synchronises); every rank made the same
    calls, so every rank decides alike."""
    if not graph:
        return symm.state(group_name, device), None
    st = symm._states.get((group_name, device.index))
    if st is None:
        return None, "captured before any eager symm call set the group up (warm up eagerly first)"
    return st, None


def _captured_fit(st: symm.GroupState, nbytes: int, tuned: list) -> str | None:
    """Why a captured call cannot run on symm: its data buffer would have to grow (synchronising,
    collective) or a block config was never tuned (timing runs synchronise) in an eager call."""
    if st.data is None or st.data.nbytes < nbytes:
        return "inside a CUDA-graph capture the symm data buffer would have to grow (warm up eagerly first)"
    if None in tuned:
        return "inside a CUDA-graph capture with a shape no eager call tuned (warm up eagerly first)"
    return None


def _generated(spec: str, dtype: torch.dtype):
    """The generated epilogue of ``spec`` (``codegen/epilogue.py``), or None when there is none or
    it cannot be generated: the caller then applies the reference (``runtime/epilogue.py``)."""
    if not spec:
        return None
    from ..codegen import epilogue as gen

    try:
        return gen.build(spec, dtype)
    except gen.Unsupported as e:
        if ("epilogue", str(e)) not in _logged:
            _logged.add(("epilogue", str(e)))
            log.info("overlap symm: epilogue %r runs as separate torch ops: %s", spec, e)
        return None


def _ep_pointers(g, args, outs=()):
    from ..codegen import epilogue as gen

    return gen.pointers(g, args, outs) if g is not None else ()


def _scratch(size: int, align: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _kernels():
    import triton

    from ..codegen import ag_mm, configs, mm_rs, reduce

    # Device-side TMA descriptors need a little global scratch per launch. Triton keeps its
    # allocator in a context variable, which autograd's backward thread does not inherit: set it
    # on every call (a context-variable write).
    triton.set_allocator(_scratch)
    return ag_mm, mm_rs, reduce, configs


def _aligned(t: Tensor) -> Tensor:
    """Contiguous, 16-byte aligned (TMA needs both)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _weight(b: Tensor) -> Tensor:
    """``b`` [K, N] as the kernels read it: row-major, or the transpose of a row-major [N, K]."""
    kmajor = b.stride(0) == 1 and b.stride(1) == b.shape[0]
    if not (kmajor or b.is_contiguous()) or b.data_ptr() % 16:
        b = b.contiguous()
        if b.data_ptr() % 16:
            b = b.clone()
    return b


def _tma_problem(dtype: torch.dtype, *inner_dims: int) -> str | None:
    if dtype not in DTYPES:
        return f"dtype {dtype} (kernels: {', '.join(map(str, DTYPES))})"
    es = dtype.itemsize
    for d in inner_dims:
        if (d * es) % 16:
            return f"a row of {d} {dtype} elements is not a multiple of 16 bytes (TMA)"
    return None


def _tune(kernel: str, key: tuple, cands, run) -> tuple:
    """Pick a block config by timing ``run(config)`` with every flag already raised (epoch 0)."""
    cfg = _picked.get((kernel, key))
    if cfg is None:
        import triton.testing

        _, _, _, configs = _kernels()
        cfg = configs.pick(kernel, key, cands, lambda c: triton.testing.do_bench(lambda: run(c), warmup=5, rep=20))
        _picked[(kernel, key)] = cfg
    return cfg


# ------------------------------------------------------------------------------------- ag_mm
def _ag_mm_problem(shard, weights, biases, gather_dim) -> str | None:
    if shard.device.type != "cuda":
        return "not a CUDA tensor"
    if gather_dim % shard.dim() == shard.dim() - 1:
        return "gather along the contraction dim"
    for w in weights:
        if w.dim() != 2 or w.dtype != shard.dtype:
            return f"weight {tuple(w.shape)} {w.dtype} is not a 2-D {shard.dtype} matrix"
        if why := _tma_problem(shard.dtype, shard.shape[-1], w.shape[1]):
            return why
    for bias in biases:
        if bias is not None and bias.dim() != 1:
            return "bias is not a vector"
    return None


@register("symm", "ag_mm")
def ag_mm(shard, weights, biases, gather_dim, group_name, return_gathered, epilogues=(), epilogue_args=()):
    args = (shard, weights, biases, gather_dim, group_name, return_gathered, epilogues, epilogue_args)
    why = _ag_mm_problem(shard, weights, biases, gather_dim) or capture_problem(shard)
    graph = why is None and capturing(shard)
    st, why = (None, why) if why else _state(group_name, shard.device, graph)
    if st is None:
        return _p2p("ag_mm", why, group_name, *args)
    ag_kernel, _, _, configs = _kernels()
    ws, r = st.ws, st.rank
    shard = _aligned(shard)
    dim = gather_dim % shard.dim()
    K = shard.shape[-1]
    rows = shard.numel() // K
    run = math.prod(shard.shape[dim:-1])
    outer = rows // run if run else 0
    chunk_bytes = rows * K * shard.element_size()
    keys = [(rows, w.shape[1], K, str(shard.dtype), w.stride(0) == 1, run == rows) for w in weights]
    gemm = ag_gemm(outer, run, K, sum(w.shape[1] for w in weights), bool(any(epilogues)))
    tuned = [_picked.get(("ag_mm", k)) for k in keys] if gemm == "triton" else []
    if graph and (why := _captured_fit(st, ws * chunk_bytes, tuned)):
        return _p2p("ag_mm", why, group_name, *args)
    PATHS["ag_mm:symm"] += 1
    PATHS[f"ag_mm:symm:{gemm}"] += 1
    st.ensure_data(ws * chunk_bytes, "ag_mm")
    buf = st.data_view(shard.dtype, (ws, rows, K))
    shard2d = shard.view(rows, K)
    weights = [_weight(w) for w in weights]
    biases = [b.contiguous() if b is not None else None for b in (biases or [None] * len(weights))]
    gshape = list(shard.shape)
    gshape[dim] *= ws
    specs = list(epilogues) or [""] * len(weights)
    gens = [_generated(spec, shard.dtype) for spec in specs]
    # an epilogue that casts to a narrower dtype may leave rows TMA cannot store: torch ops then
    gens = [None if g is not None and _tma_problem(_epilogue.out_dtype(spec, shard.dtype), w.shape[1]) else g
            for g, spec, w in zip(gens, specs, weights)]
    # an output whose epilogue could not be generated is computed plainly, its reference applied after
    outs = [shard.new_empty((ws * rows, w.shape[1]), dtype=shard.dtype if spec and g is None else
                            _epilogue.out_dtype(spec, shard.dtype)) for w, spec, g in zip(weights, specs, gens)]
    gathered = shard.new_empty(gshape) if return_gathered else shard.new_empty((0,))
    base = symm.GRAPH_BLOCK if graph else 0
    flags, status = st.flag_arg(base + symm.AG_ARRIVED), st.status_arg()

    band_rows = symm.band_rows(rows)

    def launch(i, cfg, epoch):
        ag_kernel.launch(shard2d, buf, weights[i], biases[i], outs[i], flags, epoch, status, st.timeout_ns,
                         r, ws, run, band_rows, cfg, st.num_sms, epilogue=gens[i],
                         ep_ptrs=_ep_pointers(gens[i], epilogue_args, outs))

    cfgs = [] if gemm == "cublas" else [
        _tune("ag_mm", keys[i], configs.candidates(shard.dtype, tma_store_rows=rows if run == rows else None),
              lambda cfg, i=i: launch(i, cfg, 0))
        for i in range(len(weights))
    ]

    with launcher.preloading():  # compile and load before anything waits on a peer (codegen/launcher.py)
        for i in range(len(cfgs)):
            launch(i, cfgs[i], 0)
    compute = torch.cuda.current_stream(shard.device)
    epoch = st.begin(compute, "ag_mm", graph=graph)
    nbands = _push_shard(st, shard2d)
    if gemm == "cublas":
        _ag_mm_cublas(st, shard2d, buf, weights, biases, outs, outer, run, epoch, base, nbands, compute)
    # outputs that a swiglu step reads are computed first
    for i in sorted(range(len(cfgs)), key=lambda i: bool(_epilogue.out_refs(specs[i]))):
        launch(i, cfgs[i], epoch)
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
                st.stream_wait(base + symm.AG_ARRIVED + c * nbands + nbands - 1, epoch, st.copy_stream, nbands)
                gview[:, c].copy_(buf[c].view(outer, run, K))
    st.end(compute)
    if any(spec and g is None for spec, g in zip(specs, gens)):
        outs = _epilogue.apply_all([spec if g is None else "" for spec, g in zip(specs, gens)], outs, epilogue_args)
    return gathered, outs


def _push_shard(st, shard2d: Tensor) -> int:
    """Push stream(s): this rank's shard [rows, K], band by band (``symm.bands``), into slot
    ``rank`` of every peer's receive buffer, raising the peer's AG_ARRIVED flag of each band; rank r
    pushes to r-1 first, then r-2, ... (on one stream; or at once, ``symm.PUSH_STREAM_PER_PEER``:
    either way a peer's bands go in order on one stream). Returns the number of bands per chunk."""
    ws, r = st.ws, st.rank
    rows, K = shard2d.shape
    row_bytes = K * shard2d.element_size()
    band_list = symm.bands(rows)
    nbands = len(band_list)
    for j in range(ws - 1):
        peer = (r - 1 - j) % ws
        for b, (lo, n) in enumerate(band_list):
            st.push(peer, r * rows * row_bytes + lo * row_bytes, shard2d.data_ptr() + lo * row_bytes,
                    n * row_bytes, symm.AG_ARRIVED + r * nbands + b, st.push_stream_to(peer))
    return nbands


def ag_gemm(outer: int, run: int, K: int, N: int, epilogue: bool = False) -> str:
    """How ``ag_mm`` computes a gathered [outer, ws * run, K] @ [K, N] (``N``: all its weights'
    columns): "cublas" or "triton" (see ``AG_MM_GEMM``). Depends only on shapes and module settings,
    so every rank decides alike."""
    if AG_MM_GEMM != "cublas" or epilogue:  # generated epilogues are fused into the kernel's tiles
        return "triton"
    if outer > 1 and run < AG_CUBLAS_MIN_RUN:  # one GEMM per (outer index, chunk): too many tiny ones
        return "triton"
    return "cublas" if N >= AG_CUBLAS_MIN_N else "triton"


def _ag_mm_cublas(st, shard2d, buf, weights, biases, outs, outer, run, epoch, base, nbands, compute) -> None:
    """``ag_mm``'s cuBLAS path (``AG_MM_GEMM``): each output's rows of the own chunk first, from the
    shard itself, while the copy engine brings the peers' shards; then each peer's chunk in the order
    they arrive (rank r receives r+1's first: every rank pushes to r-1 first), each after a stream
    wait on its last band's flag (bands are pushed in order on one stream). Chunk c of an output is
    ``out.view(outer, ws, run, N)[:, c]``: one GEMM per outer index."""
    ws, r, K = st.ws, st.rank, shard2d.shape[1]
    outs4 = [o.view(outer, ws, run, o.shape[1]) for o in outs]
    for p in range(ws):
        c = (r + p) % ws
        if p:
            st.stream_wait(base + symm.AG_ARRIVED + c * nbands + nbands - 1, epoch, compute, nbands)
        src = (shard2d if c == r else buf[c]).view(outer, run, K)
        for w, bias, out4 in zip(weights, biases, outs4):
            for o in range(outer):
                _mm(src[o], w, bias, out4[o, c])


# ------------------------------------------------------------------------------------- mm_rs
def _mm_problem(a, b, bias, reduce_op) -> str | None:
    if a.device.type != "cuda":
        return "not a CUDA tensor"
    if reduce_op not in ("sum", "avg"):
        return f"reduce_op {reduce_op!r} (kernels: sum, avg)"
    if a.dim() != 2 or b.dim() != 2 or a.dtype != b.dtype:
        return f"operands {tuple(a.shape)} {a.dtype} @ {tuple(b.shape)} {b.dtype}"
    if bias is not None and bias.dim() != 1:
        return "bias is not a vector"
    return _tma_problem(a.dtype, a.shape[1], b.shape[1])


def rs_gemm(outer: int, run: int, K: int, transport: str | None = None) -> str:
    """How ``mm_rs`` computes a chunk of ``outer`` runs of ``run`` rows with ``K`` (local)
    contraction: "cublas" or "triton" (see ``MM_RS_GEMM``). Depends only on shapes and module
    settings, so every rank decides alike."""
    if MM_RS_GEMM != "cublas" or (transport or TRANSPORT) != "ce":  # peer stores come from the kernel
        return "triton"
    if K < RS_CUBLAS_MIN_K or outer * run < symm.BAND_ROWS_MIN:
        return "triton"
    return "cublas" if outer == 1 or run >= RS_CUBLAS_MIN_RUN else "triton"


def _cublas_min_rows(K: int, N: int, captured: bool = False) -> int:
    """Rows of a cuBLAS-path band or chunk: each costs host time (~150 us), so at least
    ``RS_CUBLAS_BAND_FLOPS`` of GEMM work (``RS_CUBLAS_BAND_FLOPS_CAPTURED`` in a captured call,
    where it is set) and ``symm.BAND_ROWS_MIN`` rows."""
    flops = RS_CUBLAS_BAND_FLOPS
    if captured and RS_CUBLAS_BAND_FLOPS_CAPTURED is not None:
        flops = RS_CUBLAS_BAND_FLOPS_CAPTURED
    return max(symm.BAND_ROWS_MIN, math.ceil(flops / max(1, 2 * K * N)))


def rs_band_span(band: list[tuple[int, int, int]], run: int) -> tuple[int, int]:
    """(first local row, rows) of a band of ``rs_cublas_bands``: its pieces are consecutive rows."""
    return band[0][0] * run + band[0][1], sum(n for _, _, n in band)


def rs_cublas_bands(outer: int, run: int, K: int, N: int, captured: bool = False) -> list[list[tuple[int, int, int]]]:
    """The bands of the cuBLAS path over a chunk of ``outer`` runs of ``run`` rows of a [.., K] @
    [K, N] GEMM: each a list of (run index, first row, rows) pieces, one contiguous GEMM each,
    covering consecutive local rows (local row ``o * run + j``). At most ``symm.MAX_BANDS`` bands of
    at least ``symm.BAND_ROWS_MIN`` rows and ``RS_CUBLAS_BAND_FLOPS``; one run is cut into equal
    bands, several are grouped whole. ``captured``: for a call captured in a CUDA graph (every rank
    of the group captures it alike)."""
    min_rows = _cublas_min_rows(K, N, captured)
    if outer == 1:
        nb = max(1, min(symm.MAX_BANDS, run // min_rows))
        per = max(1, -(-run // nb))
        return [[(0, lo, min(per, run - lo))] for lo in range(0, run, per)] or [[(0, 0, 0)]]
    per = max(-(-outer // symm.MAX_BANDS), -(-min_rows // run))
    per = -(-outer // -(-outer // per))  # the same number of bands, as even as they go
    return [[(o, 0, run) for o in range(o0, min(o0 + per, outer))] for o0 in range(0, outer, per)]


@register("symm", "mm_rs")
def mm_rs(a, b, bias, out_shape, scatter_dim, reduce_op, group_name, epilogue="", epilogue_args=()):
    args = (a, b, bias, out_shape, scatter_dim, reduce_op, group_name, epilogue, epilogue_args)
    out_shape = list(out_shape)
    dim = scatter_dim % len(out_shape)
    why = _mm_problem(a, b, bias, reduce_op) or capture_problem(a)
    if why is None and dim == len(out_shape) - 1:
        why = "scatter along the output's columns"
    configs = _kernels()[3] if why is None else None
    graph = why is None and capturing(a)
    st = gemm = None
    if why is None:
        ws = _group_size(group_name)
        seg = out_shape[dim] // ws
        run = seg * math.prod(out_shape[dim + 1 : -1])
        outer = math.prod(out_shape[:dim])
        gemm = rs_gemm(outer, run, a.shape[1], "ce" if graph else None)
        # TMA variants (codegen/mm_rs.py) where the transport is the copy engine and chunks are contiguous
        ce = graph or TRANSPORT == "ce"
        cands = configs.candidates(a.dtype, None if outer == 1 else run,
                                   tma_store_rows=run if ce and outer == 1 and RS_TMA else None)
        if RS_TMA == "only":
            cands = [c for c in cands if c[6]] or cands
        if gemm == "triton" and not cands:
            why = f"runs of {run} rows are not a multiple of any block height"
        else:
            st, why = _state(group_name, a.device, graph)
    if st is not None:
        key = (a.shape[0], b.shape[1], a.shape[1], str(a.dtype), b.stride(0) == 1, run if outer > 1 else 0,
               f"tma={RS_TMA}")  # the candidates differ with RS_TMA
        nbytes = ws * outer * run * b.shape[1] * a.element_size()
        tuned = [_picked.get(("mm_rs", key))] if gemm == "triton" else []
        why = _captured_fit(st, nbytes, tuned) if graph else None
    if st is None or why:
        return _p2p("mm_rs", why, group_name, *args)
    PATHS["mm_rs:symm"] += 1
    PATHS[f"mm_rs:symm:{gemm}"] += 1
    ws = st.ws
    a, b, bias = _aligned(a), _weight(b), (bias.contiguous() if bias is not None else None)
    N = b.shape[1]
    rows = outer * run
    chunk_bytes = rows * N * a.element_size()
    st.ensure_data(ws * chunk_bytes, "mm_rs")
    recv = st.data_view(a.dtype, (ws * rows, N))
    base = symm.GRAPH_BLOCK if graph else 0
    average = reduce_op == "avg"
    g = _generated(epilogue, a.dtype)
    chunk_shape = list(out_shape)
    chunk_shape[dim] = seg
    if gemm == "cublas":  # a generated epilogue runs in the kernel that reduces the partials
        out = _mm_rs_cublas(st, a, b, bias, recv, outer, run, average, graph, g, epilogue_args).view(chunk_shape)
        return _epilogue.apply(epilogue, out, epilogue_args) if epilogue and g is None else out
    # captured calls ship by copy engine: peer stores wait for READY by epoch, inside the kernel
    peer = _peer_args(st, 0) if TRANSPORT == "peer" and not graph else None
    out = a.new_empty((rows, N), dtype=_epilogue.out_dtype(epilogue, a.dtype) if g is not None else a.dtype)
    stage = a.new_empty((ws * rows, N)) if peer is None else out
    ep_ptrs = _ep_pointers(g, epilogue_args)

    def launch(cfg, epoch, peer, stage):
        _launch_rs(st, a, b, bias, stage, recv, None, out, epoch, rows, run, 1, 0, 0, average, cfg, peer,
                   epilogue=g, ep_ptrs=ep_ptrs, base=base)

    # Tuning runs without communication: with the local staging transport even when peer stores are
    # on (a peer-store run at epoch 0 would write into peers' buffers while they may be reading them).
    cfg = _tune("mm_rs", key, cands, lambda cfg: launch(cfg, 0, None, stage if peer is None else torch.empty_like(recv)))
    if cfg[6]:
        PATHS["mm_rs:symm:triton-tma"] += 1
    with launcher.preloading():
        launch(cfg, 0, peer, stage)
    compute = torch.cuda.current_stream(a.device)
    epoch = st.begin(compute, "mm_rs", graph=graph)
    launch(cfg, epoch, peer, stage)
    if peer is None:
        _push_partials(st, stage, rows, N, symm.bands(rows), epoch, base)
    st.end(compute)
    out = out.view(chunk_shape)
    return _epilogue.apply(epilogue, out, epilogue_args) if epilogue and g is None else out


def _push_partials(st, stage, rows, N, band_list, epoch, base):
    """Push stream: each band of each peer's chunk in ``stage`` [ws * rows, N], once its done flag
    is raised, into that peer's receive buffer, raising the peer's arrival flag."""
    ws, r = st.ws, st.rank
    row_bytes = N * stage.element_size()
    nb = len(band_list)
    for pos in range(ws - 1):
        c = (r + 1 + pos) % ws
        stream = st.push_stream_to(c)
        for b, (lo, n) in enumerate(band_list):
            st.stream_wait(base + symm.DONE + c * nb + b, epoch, stream, nb)
            st.push(c, r * rows * row_bytes + lo * row_bytes, stage.data_ptr() + (c * rows + lo) * row_bytes,
                    n * row_bytes, symm.RS_ARRIVED + r * nb + b, stream)


def _wait_on_push_streams(st, word: int, epoch: int, nbands: int = 1) -> None:
    """Every stream this call pushes to its peers on waits for this rank's flag ``word`` >= ``epoch``
    (one stream wait per distinct stream)."""
    for stream in {id(s): s for s in (st.push_stream_to(p) for p in range(st.ws) if p != st.rank)}.values():
        st.stream_wait(word, epoch, stream, nbands)


def _mm_rs_cublas(st, a, b, bias, recv, outer, run, average, graph, epilogue=None, epilogue_args=()) -> Tensor:
    """The cuBLAS path of ``mm_rs`` (``MM_RS_GEMM``): the reduced own chunk [outer * run, N], with
    the generated ``epilogue`` (``codegen/epilogue.py``; None: none) applied.

    Chunk c of ``a`` is ``a3[:, c]`` with ``a3 = a.view(outer, ws, run, K)``. Remote chunks first,
    band by band (``rs_cublas_bands``): each band's GEMMs write ``stage`` and a stream write raises
    its done flag; the push stream ships it as for the kernel. Then the own bands: a chunk of one
    band computes its own partial into the receive buffer's own slot while the transfer runs
    (``RS_OWN_FIRST``), then waits for the peers' and one kernel reduces the ws slots (in float32
    for 16-bit types); with several bands each waits first, and at ws 2 without bias one ``addmm``
    adds the peer's partial in cuBLAS's epilogue. An ``epilogue`` runs in the reducing kernel (the
    generated ``reduce_kernel``; at ws 2 too, instead of ``addmm``). Fusing an epilogue by running the chunk on the Triton kernel instead cost that
    kernel's slower GEMM (TP block training step under CUDA graphs 9.18 vs 8.78 ms unfused, 2xH200,
    fourteenth session)."""
    ws, r = st.ws, st.rank
    K, N = a.shape[1], b.shape[1]
    rows = outer * run
    base = symm.GRAPH_BLOCK if graph else 0
    a3 = a.view(outer, ws, run, K)
    slots = recv.view(ws, rows, N)
    recv4 = recv.view(ws, outer, run, N)
    stage = a.new_empty((ws * rows, N))
    stage4 = stage.view(ws, outer, run, N)
    out = a.new_empty((rows, N), dtype=_epilogue.out_dtype(epilogue.spec, a.dtype) if epilogue is not None else a.dtype)
    out3 = out.view(outer, run, N)
    ep_ptrs = _ep_pointers(epilogue, epilogue_args)
    bands = rs_cublas_bands(outer, run, K, N, captured=graph)
    nb = len(bands)
    compute = torch.cuda.current_stream(a.device)
    epoch = st.begin(compute, "mm_rs", graph=graph)
    for pos in range(ws - 1):
        c = (r + 1 + pos) % ws
        for i, band in enumerate(bands):
            for o, j, n in band:
                _mm(a3[o, c, j : j + n], b, bias, stage4[c, o, j : j + n])
            _cuda.write_value32(st.flag_addr(base + symm.DONE + c * nb + i), epoch, compute)
    _push_partials(st, stage, rows, N, [rs_band_span(band, run) for band in bands], epoch, base)
    own_first = RS_OWN_FIRST and nb == 1
    for i, band in enumerate(bands):
        if own_first:  # the own partial overlaps the transfer of the peers' (one band)
            for o, j, n in band:
                _mm(a3[o, r, j : j + n], b, bias, recv4[r, o, j : j + n])
        for p in range(1, ws):
            st.stream_wait(base + symm.RS_ARRIVED + (r + p) % ws * nb + i, epoch, compute, nb)
        for o, j, n in band:
            if epilogue is None and not own_first:
                _reduce_own(a3[o, r, j : j + n], b, bias, recv4[:, o, j : j + n], r, out3[o, j : j + n], average)
                continue
            if not own_first:
                _mm(a3[o, r, j : j + n], b, bias, recv4[r, o, j : j + n])
            _reduce_slots(slots, out, o * run + j, n, average, epilogue, ep_ptrs)
    st.end(compute)
    return out


def _reduce_own(a, b, bias, slots, rank, out, average) -> None:
    """An own band that waited for the peers' partials first (several bands, or ``RS_OWN_FIRST``
    off): ``out`` = the sum (``average``: mean) over ranks of their partials of these rows, this
    rank's ``a @ b (+ bias)`` and the peers' in ``slots`` [ws, rows, N] (slot ``rank`` is free).
    At ws 2 without bias one ``addmm`` adds the peer's in cuBLAS's epilogue; otherwise the own
    partial goes into its slot and one kernel reduces the slots."""
    ws = slots.shape[0]
    scale = 1.0 / ws if average else 1.0
    if ws == 2 and bias is None:
        torch.addmm(slots[1 - rank], a, b, beta=scale, alpha=scale, out=out)
    else:
        _mm(a, b, bias, slots[rank])
        _reduce_slots(slots, out, 0, out.shape[0], average)


def _reduce_slots(slots, out, row0, n, average, epilogue=None, ep_ptrs=()) -> None:
    """``out[row0 : row0 + n]`` = the sum (``average``: mean) of the ranks' partials of those rows
    in ``slots`` [ws, rows, N] (rows numbered as the op's output), summed in float32 and rounded
    once; with the generated ``epilogue`` applied in the same kernel."""
    if not n:
        return
    if epilogue is None:
        (torch.mean if average else torch.sum)(slots[:, row0 : row0 + n], dim=0, out=out[row0 : row0 + n])
        return
    from ..codegen import epilogue as gen

    gen.apply_reduce(epilogue, slots, out, row0, n, 1.0 / slots.shape[0] if average else 1.0, ep_ptrs)


def _mm(a, b, bias, out) -> None:
    if bias is None:
        torch.mm(a, b, out=out)
    else:
        torch.addmm(bias, a, b, out=out)


def _launch_rs(st, a, b, bias, stage, recv, gather, out, epoch, rows, run, rounds, out_round_stride, out_offset,
               average, cfg, peer, epilogue=None, ep_ptrs=(), base=0, copy_out=False):
    """The mm_rs / mm_ar producer kernel on this group's counters, flags, ticket and status word
    (those of the flag block at ``base``: 0, or ``symm.GRAPH_BLOCK`` for a captured call).
    ``copy_out`` (mm_ar): the kernel copies the peers' gathered bands into ``out`` itself."""
    _, rs_kernel, _, _ = _kernels()
    rs_kernel.launch(a, b, bias, stage, recv, gather, out, st.flag_arg(base + symm.COUNTERS),
                     st.flag_arg(base + symm.DONE), st.flag_arg(base + symm.RS_ARRIVED),
                     st.flag_arg(base + symm.TICKET), epoch, st.status_arg(), st.timeout_ns,
                     st.rank, st.ws, rows, run, rounds, out_round_stride, out_offset, average, symm.band_rows(rows),
                     cfg, st.num_sms, peer=peer, epilogue=epilogue, ep_ptrs=ep_ptrs,
                     gathered=st.flag_arg(base + symm.GATHERED) if copy_out else None)


# ------------------------------------------------------------------------------------- mm_ar
def ar_rounds(m: int, ws: int) -> int:
    """Row blocks of ``mm_ar``: enough that the last round's all-gather is short, chunks of at least
    ``AR_ROWS_PER_CHUNK`` rows so that each stays an efficient GEMM."""
    return max(1, min(symm.AR_MAX_ROUNDS, m // (ws * symm.AR_ROWS_PER_CHUNK)))


@register("symm", "mm_ar")
def mm_ar(a, b, bias, reduce_op, group_name, epilogue="", epilogue_args=()):
    """One-shot: the epilogue runs in the sum kernel. Rounds: the all-reduce, then the epilogue as
    one generated pointwise kernel (the reduced rows of other ranks arrive by copy engine after the
    GEMM's last tile, so no GEMM tile could apply it)."""
    args = (a, b, bias, reduce_op, group_name, epilogue, epilogue_args)
    why = _mm_problem(a, b, bias, reduce_op) or capture_problem(a)
    graph = why is None and capturing(a)
    st, why = (None, why) if why else _state(group_name, a.device, graph)
    if st is not None and graph:
        why = _captured_fit(st, *_mm_ar_needs(a, b, st.ws))
    if st is None or why:
        return _p2p("mm_ar", why, group_name, *args)
    g = _generated(epilogue, a.dtype)
    out, fused = _mm_ar_symm(st, a, b, bias, reduce_op, g, epilogue_args, graph)
    return out if fused else _epilogue_after(epilogue, g, out, epilogue_args)


def _epilogue_after(epilogue: str, g, out: Tensor, epilogue_args) -> Tensor:
    """``epilogue`` applied to a finished ``out``: one generated pointwise kernel (``g``), or the
    reference torch ops where it could not be generated."""
    if not epilogue:
        return out
    if g is None:
        return _epilogue.apply(epilogue, out, epilogue_args)
    from ..codegen import epilogue as gen

    return gen.apply_pointwise(g, out, epilogue_args)


def _mm_ar_key(a, b) -> tuple:
    return (a.shape[0], b.shape[1], a.shape[1], str(a.dtype), b.stride(0) == 1)


def _mm_ar_rounds_layout(M: int, ws: int) -> tuple[int, int]:
    """(rounds, rows per chunk and round) of ``mm_ar``'s rounds path."""
    rounds = ar_rounds(M, ws)
    return rounds, -(-M // (rounds * ws))


def _mm_ar_needs(a, b, ws: int) -> tuple[int, list]:
    """(data bytes, [the tuned config or None]) of an ``mm_ar`` call: what a captured call needs."""
    M, N, es = a.shape[0], b.shape[1], a.element_size()
    if M * N * es <= symm.ONESHOT_MAX_BYTES:
        return ws * M * N * es, []  # one-shot: no tuned kernel
    if ar_gemm(M, a.shape[1], ws, "ce") == "cublas":
        rounds = ar_cublas_rounds(M, a.shape[1], N, ws)
        return 2 * rounds * ws * -(-M // (rounds * ws)) * N * es, []  # no tuned kernel
    rounds, rows = _mm_ar_rounds_layout(M, ws)
    return 2 * rounds * ws * rows * N * es, [_picked.get(("mm_ar", _mm_ar_key(a, b)))]


def _mm_ar_symm(st, a, b, bias, reduce_op, g=None, epilogue_args=(), graph=False):
    """(the all-reduced result, whether the epilogue ``g`` was applied in it: one-shot only)."""
    PATHS["mm_ar:symm"] += 1
    ws, r = st.ws, st.rank
    a, b, bias = _aligned(a), _weight(b), (bias.contiguous() if bias is not None else None)
    M, N = a.shape[0], b.shape[1]
    es = a.element_size()
    base = symm.GRAPH_BLOCK if graph else 0
    if M * N * es <= symm.ONESHOT_MAX_BYTES:
        return _mm_ar_oneshot(st, a, b, bias, reduce_op == "avg", g, epilogue_args, graph), g is not None
    if ar_gemm(M, a.shape[1], ws, "ce" if graph else None) == "cublas":
        PATHS["mm_ar:symm:cublas"] += 1
        return _mm_ar_cublas(st, a, b, bias, reduce_op == "avg", graph), False
    configs = _kernels()[3]
    rounds, rows = _mm_ar_rounds_layout(M, ws)
    slot_bytes = rows * N * es
    region = rounds * ws * slot_bytes
    st.ensure_data(2 * region, "mm_ar")
    recv = st.data_view(a.dtype, (rounds * ws * rows, N))
    gather = st.data_view(a.dtype, (rounds * ws * rows, N), region)
    peer = _peer_args(st, region) if TRANSPORT == "peer" and not graph else None
    out = a.new_empty((M, N))
    stage = a.new_empty((rounds * ws * rows, N)) if peer is None else out

    copy_out = AR_KERNEL_COPY_OUT
    host_copies = () if copy_out else range(1, ws)  # (with copy_out, the kernel's copy tiles do it)

    def launch(cfg, epoch, peer, stage):
        _launch_rs(st, a, b, bias, stage, recv, gather, out, epoch, rows, rows, rounds, ws * rows, r * rows,
                   reduce_op == "avg", cfg, peer, base=base, copy_out=copy_out)

    cfg = _tune("mm_ar", _mm_ar_key(a, b), configs.candidates(a.dtype),
                lambda cfg: launch(cfg, 0, None, stage if peer is None else torch.empty_like(recv)))
    with launcher.preloading():
        launch(cfg, 0, peer, stage)
    compute = torch.cuda.current_stream(a.device)
    epoch = st.begin(compute, "mm_ar", graph=graph)
    launch(cfg, epoch, peer, stage)
    gather_base = st.data_addr(r, region)
    row_bytes = N * es
    band_list = symm.bands(rows)
    nb = len(band_list)
    for rnd in range(rounds):
        for pos in range(ws - 1 if peer is None else 0):  # reduce-scatter: this rank's partials of the chunks peers own
            c = (r + 1 + pos) % ws
            slot = rnd * ws + c
            stream = st.push_stream_to(c)
            for b, (lo, n) in enumerate(band_list):
                st.stream_wait(base + symm.DONE + slot * nb + b, epoch, stream, nb)
                st.push(c, (rnd * ws + r) * slot_bytes + lo * row_bytes, stage.data_ptr() + (slot * rows + lo) * row_bytes,
                        n * row_bytes, symm.RS_ARRIVED + (rnd * ws + r) * nb + b, stream)
        own = rnd * ws + r
        for b, (lo, n) in enumerate(band_list if peer is None else ()):  # all-gather: reduced bands, to every peer
            _wait_on_push_streams(st, base + symm.DONE + own * nb + b, epoch, nb)
            for j in range(1, ws):
                st.push((r - j) % ws, region + own * slot_bytes + lo * row_bytes,
                        gather_base + own * slot_bytes + lo * row_bytes, n * row_bytes, symm.GATHERED + own * nb + b,
                        st.push_stream_to((r - j) % ws))
        for j in host_copies:  # copy the peers' reduced bands out of the receive buffer
            q = (r + j) % ws
            for b, (lo, n) in enumerate(band_list):
                first = (rnd * ws + q) * rows + lo
                count = min(n, M - first)
                st.stream_wait(base + symm.GATHERED + (rnd * ws + q) * nb + b, epoch, st.copy_stream, nb)
                if count > 0:
                    _cuda.memcpy_async(out[first].data_ptr(), gather_base + (rnd * ws + q) * slot_bytes + lo * row_bytes,
                                       count * row_bytes, st.copy_stream)
    st.end(compute)
    return out, False


def ar_gemm(M: int, K: int, ws: int, transport: str | None = None) -> str:
    """How ``mm_ar``'s rounds path computes: "cublas" where ``mm_rs`` would and the kernel would run
    one round, else "triton". Measured on 2xH200 (probe_symm, ninth session, K=7168 N=8192, back to
    back): M=1024 (one round) cuBLAS 0.570 ms vs kernel 0.782; but M=4096: 0.898-0.956 vs 0.834 and
    M=8192: 1.738-1.764 vs 1.666, where the kernel's four rounds hide the all-gather and cuBLAS
    rounds cost host time."""
    if ar_rounds(M, ws) > 1:
        return "triton"
    return rs_gemm(1, -(-M // ws), K, transport)


def ar_cublas_rounds(M: int, K: int, N: int, ws: int) -> int:
    """Row blocks of ``mm_ar``'s cuBLAS path: as for the kernel (``ar_rounds``), but with chunks of
    at least ``RS_CUBLAS_BAND_FLOPS`` of GEMM work (each round costs host time, as a band does)."""
    return max(1, min(symm.AR_MAX_ROUNDS, M // (ws * _cublas_min_rows(K, N))))


def _mm_ar_cublas(st, a, b, bias, average, graph=False) -> Tensor:
    """``mm_ar``'s rounds on cuBLAS (eager calls; see ``MM_RS_GEMM``): the all-reduced [M, N].

    Per round t (``ar_cublas_rounds``; chunk c of round t is rows ``(t * ws + c) * rows`` on, one
    band each): the peers' chunks first, each GEMM into ``stage`` then raising its done flag, the
    push stream shipping it to its owner as in ``mm_rs``; then the own chunk's partial goes into
    the receive slot (``RS_OWN_FIRST``: before waiting for the peers', so it overlaps their
    transfers) and one summing kernel reduces the slots into ``out``; a stream write raises its done flag and the push
    stream sends those rows of ``out`` to every peer's gather region (the all-gather), while the
    next round computes; the copy stream copies the peers' reduced chunks into ``out`` as their
    flags rise. ``graph``: a call being captured (the flag block ``symm.GRAPH_BLOCK``)."""
    ws, r = st.ws, st.rank
    base = symm.GRAPH_BLOCK if graph else 0
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

    compute = torch.cuda.current_stream(a.device)
    epoch = st.begin(compute, "mm_ar", graph=graph)
    for t in range(rounds):
        for pos in range(ws - 1):  # reduce-scatter: this rank's partials of the chunks peers own
            c = (r + 1 + pos) % ws
            slot = t * ws + c
            lo, n = rows_of(slot)
            if n:
                _mm(a[lo : lo + n], b, bias, stage[lo : lo + n])
            _cuda.write_value32(st.flag_addr(base + symm.DONE + slot), epoch, compute)
            st.stream_wait(base + symm.DONE + slot, epoch, st.push_stream_to(c))
            st.push(c, (t * ws + r) * slot_bytes, stage.data_ptr() + lo * row_bytes, n * row_bytes,
                    symm.RS_ARRIVED + t * ws + r, st.push_stream_to(c))
        own = t * ws + r
        lo, n = rows_of(own)
        slots = recv.view(rounds, ws, rows, N)[t, :, :n]
        if RS_OWN_FIRST and n:  # the own partial overlaps the peers' transfers
            _mm(a[lo : lo + n], b, bias, slots[r])
        for p in peers:
            st.stream_wait(base + symm.RS_ARRIVED + t * ws + p, epoch, compute)
        if RS_OWN_FIRST:
            _reduce_slots(slots, out[lo : lo + n], 0, n, average)
        elif n:
            _reduce_own(a[lo : lo + n], b, bias, slots, r, out[lo : lo + n], average)
        _cuda.write_value32(st.flag_addr(base + symm.DONE + own), epoch, compute)
        _wait_on_push_streams(st, base + symm.DONE + own, epoch)
        for j in range(1, ws):  # all-gather: the reduced chunk, to every peer
            st.push((r - j) % ws, region + own * slot_bytes, out.data_ptr() + lo * row_bytes, n * row_bytes,
                    symm.GATHERED + own, st.push_stream_to((r - j) % ws))
        for q in peers:  # the peers' reduced chunks, out of the gather region as they arrive
            qlo, qn = rows_of(t * ws + q)
            st.stream_wait(base + symm.GATHERED + t * ws + q, epoch, st.copy_stream)
            if qn:
                _cuda.memcpy_async(out.data_ptr() + qlo * row_bytes, gather_base + (t * ws + q) * slot_bytes,
                                   qn * row_bytes, st.copy_stream)
    st.end(compute)
    return out


def _peer_args(st, gather_offset: int) -> dict:
    data, flags = st.peer_tables()
    return dict(data=data, flags=flags, ready=st.flag_arg(symm.READY), gather_offset=gather_offset,
                rs_flag_word=symm.RS_ARRIVED, ag_flag_word=symm.GATHERED)


def _mm_ar_oneshot(st, a, b, bias, average, g=None, epilogue_args=(), graph=False):
    PATHS["mm_ar:oneshot"] += 1
    _, _, reduce_kernel, _ = _kernels()
    ws, r = st.ws, st.rank
    M, N = a.shape[0], b.shape[1]
    base = symm.GRAPH_BLOCK if graph else 0
    partial = torch.mm(a, b) if bias is None else torch.addmm(bias, a, b)
    nbytes = M * N * a.element_size()
    st.ensure_data(ws * nbytes, "mm_ar")
    recv = st.data_view(a.dtype, (ws * M, N))
    out = a.new_empty((M, N), dtype=_epilogue.out_dtype(g.spec, a.dtype) if g is not None else a.dtype)
    ep_ptrs = _ep_pointers(g, epilogue_args)

    def launch(epoch):
        reduce_kernel.launch(partial, recv, out, st.flag_arg(base + symm.RS_ARRIVED), epoch, st.status_arg(),
                             st.timeout_ns, r, ws, average, epilogue=g, ep_ptrs=ep_ptrs)

    with launcher.preloading():
        launch(0)
    compute = torch.cuda.current_stream(a.device)
    epoch = st.begin(compute, "mm_ar (one-shot)", graph=graph)
    for j in range(1, ws):
        st.push((r - j) % ws, r * nbytes, partial.data_ptr(), nbytes, symm.RS_ARRIVED + r, st.push_stream_to((r - j) % ws))
    launch(epoch)
    st.end(compute)
    return out
