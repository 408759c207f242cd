"""The ``symm`` lowering of ``overlap::cta_pipeline_mlp``: CTA-pipelining (kernels: ``codegen/cta.py``).

The group's ``ws`` ranks form two stages of ``tp = ws // 2`` ranks. Stage 0 computes the first GEMM
and the activation, stage 1 the second GEMM, *at the same time*: stage-0 tiles go straight into the
stage-1 ranks' memory and every stage-1 CTA waits only for the K-chunks of the rows it reads. How a
call splits its work is ``runtime/cta_plan.py``; the weights each rank keeps, ``runtime/cta_weights.py``.

Assumption of the rewrite (true of the tensor-parallel MLP the pass matches): ``x`` is the same on
every rank; stage-0 ranks read their own copy.

What the kernels do not cover falls back to ``p2p`` (a decision that depends only on shapes,
dtypes and arguments, so the same on every rank).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..codegen import launcher
from ..spec import knobs, symm_layout
from . import cuda as _cuda
from . import cta_cublas, cta_weights, symm
from .cta_plan import ChunkPlan, chunk_plan
from .lowering import register
from .ops import group_size
from .symm import private_graphs
from .symm.lowering_helpers import PATHS, capturing, eager_protocol_run, load_kernels, run_on_p2p, tma_aligned, tma_problem

_staging: dict[tuple, Tensor] = {}
_staging_kept: list[Tensor] = []  # staging buffers outgrown after a call was captured (graphs may use them)
_captured = False  # a cta_pipeline_mlp call was captured in a CUDA graph (in this process)

# Host time per call matters at decode / small-prefill sizes (an eager call at M=512 was host-bound
# on the H200 hosts: about 0.45 ms to enqueue), so what follows from shapes and knobs alone is
# computed once: problem's verdict, the chunk plan, and whether this call's kernel variants were
# compiled and loaded already (launcher.preloading computes a variant key per launch otherwise).
_verdicts: dict[tuple, str | None] = {}
_plans: dict[tuple, ChunkPlan] = {}
_preloaded_calls: dict[tuple, bool] = {}
# cta_cublas.stage_gemms and stage0_kernel_form per shape and knob generation
_forms: dict[tuple, tuple[str, str, str | None]] = {}


def _cached(cache: dict, key, compute):
    """``cache[key]``, from ``compute()`` the first time (a server with ever new token counts: a cache
    beyond ``knobs.cta.CACHE_MAX`` entries starts over)."""
    if key not in cache:
        if len(cache) >= knobs.cta.CACHE_MAX:
            cache.clear()
        cache[key] = compute()
    return cache[key]


def _shapes(*tensors) -> tuple:
    return tuple(None if t is None else (t.shape, t.dtype, t.device.type) for t in tensors)  # torch.Size hashes


def problem(x, w1, b1, w3, b3, w2, b2, activation, approximate, stages, ws) -> str | None:
    """Why the kernels do not cover this call (None: they do); shapes, dtypes and arguments only."""
    if x.device.type != "cuda":
        return "not a CUDA tensor"
    if (activation, approximate) not in {("gelu", "none"), ("gelu", "tanh"), ("swiglu", "none")}:
        return f"activation {activation!r}/{approximate!r}"
    if stages != 2:
        return f"stages={stages} (the symm kernels pipeline exactly 2 GEMM stages)"
    if ws % 2:
        return f"a group of {ws} ranks (two stages of equal size needed)"
    mats = [("x", x), ("w1", w1), ("w2", w2)] + ([("w3", w3)] if w3 is not None else [])
    for name, t in mats:
        if t.dim() != 2 or t.dtype != x.dtype:
            return f"{name} {tuple(t.shape)} {t.dtype} is not a 2-D {x.dtype} matrix"
    for name, t in (("b1", b1), ("b3", b3), ("b2", b2)):
        if t is not None and (t.dim() != 1 or t.dtype != x.dtype):
            return f"{name} {tuple(t.shape)} {t.dtype} is not a {x.dtype} vector"
    tp = ws // 2
    F, N = w1.shape[1] * ws, w2.shape[1]
    if F % (tp * 128):
        return f"F={F} is not a multiple of {tp * 128} (128 columns per stage-0 rank's tile)"
    if N % tp:
        return f"N={N} does not split over {tp} stage-1 ranks"
    if -(-x.shape[0] // 64) * tp > symm_layout.CTA_ROW_WORDS:
        return f"{x.shape[0]} rows (at most {symm_layout.CTA_ROW_WORDS // tp * 64})"
    return tma_problem(x.dtype, x.shape[1], F, F // tp, N, N // tp)


@register("symm", "cta_pipeline_mlp")
def cta_pipeline_mlp(x, w1, b1, w3, b3, w2, b2, activation, approximate, stages, group_name):
    global _captured
    args = (x, w1, b1, w3, b3, w2, b2, activation, approximate, stages, group_name)
    ws = group_size(group_name)
    shapes = _shapes(x, w1, b1, w3, b3, w2, b2)
    verdict_key = (shapes, activation, approximate, stages, ws)
    why = _cached(_verdicts, verdict_key,
                  lambda: problem(x, w1, b1, w3, b3, w2, b2, activation, approximate, stages, ws))
    st = None if why else symm.state(group_name, x.device)
    if st is None:
        return run_on_p2p("cta_pipeline_mlp", why, group_name, *args)
    from ..codegen import cta

    load_kernels()  # the TMA scratch allocator
    PATHS["cta_pipeline_mlp:symm"] += 1
    r, tp = st.rank, ws // 2
    stage, idx = divmod(r, tp)
    M, H = x.shape
    F, N = w1.shape[1] * ws, w2.shape[1]
    out = x.new_empty((M, N))
    if M == 0:
        return out
    swiglu = activation == "swiglu"
    # the plan and the kernel variants depend on the CTA knobs (probes and tests patch them)
    plan_key = (M, F, N, H, tp, swiglu, x.dtype, st.num_sms, tuple(knobs.cta.values().items()))
    plan = _cached(_plans, plan_key, lambda: chunk_plan(M, F, N, tp, swiglu, x.dtype, st.num_sms, H=H))
    if plan.flag_words > symm_layout.CTA_CHUNK_WORDS // 2:
        return run_on_p2p("cta_pipeline_mlp", f"{M} rows need more chunk flags than {symm_layout.CTA_CHUNK_WORDS // 2}",
                    group_name, *args)
    # each stage's GEMM on its Triton kernel or on cuBLAS (runtime/cta_cublas.py), alike on every rank
    s0, s1, asked0 = _cached(_forms, (M, F, N, H, ws, x.dtype, knobs.generation()),
                             lambda: (*cta_cublas.stage_gemms(ws, M, H, F, N, x.dtype),
                                      cta_cublas.stage0_kernel_form(M, H, F // tp, ws, x.dtype)))
    PATHS[f"cta_pipeline_mlp:symm:stage{stage}_{(s0, s1)[stage]}"] += 1
    graph = capturing(x)  # (a private graph's eager runs too: the captured protocol without a capture)
    captured = graph and not eager_protocol_run(x)  # (an eager run lays weights out: a collective)
    placed = cta_weights.place(st, w1, b1, w3, b3, w2, b2, plan.window, captured)
    cfg0, cfg1, f1, kchunk, nch, nch1 = plan.cfg0, plan.cfg1, plan.f1, plan.kchunk, plan.nch, plan.nch1
    bm, group_m, tiles_m, groups = cfg0[0], cfg0[3], plan.tiles_m, plan.groups
    fp = (F - f1) // tp
    first = placed.first_gemm_weights(stage, idx, tp, F, f1, plan.window[1])
    tail = plan.tail
    es = x.element_size()
    mp = tiles_m * bm
    block_bytes = mp * kchunk * es  # one K-chunk of one stage-0 rank, chunk-major
    y_offset = -(-((tp * nch + nch1) * block_bytes) // 256) * 256
    part_offset = -(-(y_offset + M * N * es) // 256) * 256  # the tails' partial products [tp, M, N/tp]
    need = part_offset + (M * N * es if tail else 0)
    if captured and (st.data is None or st.data.nbytes < need):
        raise RuntimeError("overlap symm: cta_pipeline_mlp was captured in a CUDA graph before an eager call of this "
                           "size: run it once eagerly first (the symmetric buffers grow, collectively, outside the "
                           "capture; torch.compile's mode='reduce-overhead' warms up eagerly)")
    st.ensure_data(need, "cta_pipeline_mlp")
    data, flags = st.peer_tables()
    compute = torch.cuda.current_stream(x.device)
    base = symm_layout.cta_block(graph)
    word = lambda off: st.flag_arg(base + off)  # noqa: E731
    status = st.status_arg()
    epoch_word = word(symm_layout.CTA_EPOCH)
    # (cuBLAS stage 0 stages its blocks whatever the transport: the copy engine ships them)
    ready, staged = (word(symm_layout.CTA_READY) if graph else None), knobs.cta.TRANSPORT == "ce" or s0 == "cublas"
    act = cta.ACTIVATIONS[(activation, approximate)]
    xa = tma_aligned(x)
    stage_buf = _staging_buffer(x, nch * mp * kchunk, "blocks") if stage == 0 and staged else None
    m0 = plan.tail_group * group_m * bm  # the tail's rows: the last row group's
    keep = _staging_buffer(x, (mp - m0) * tail, "tail") if stage == 0 and tail else None
    ship_first = bool(tail) and tp == 1 and knobs.cta.SHIP_BEFORE_TAILS
    part = st.data_view(x.dtype, (tp * M * (N // tp),), part_offset) if tail else None
    split_partials = None  # split-K's float32 partial sums (its counters: the start of CTA_Y_COUNTERS)
    numel0 = cta.stage0_partials_numel(M, H, fp, cfg0, plan.split0, st.num_sms, 1 + swiglu, tail=True)
    if stage == 0 and s0 == "triton" and numel0:  # (split runs, or a stream-K last round)
        split_partials = _staging_buffer(x, numel0, "split", torch.float32)
    if stage == 1 and s1 == "triton" and plan.split1 > 1:
        split_partials = _staging_buffer(x, cta.split_partials_numel(M, N // tp, cfg1, plan.split1), "split",
                                         torch.float32)

    tma_store = knobs.cta.STAGE0_TMA_STORE
    form0 = (cta.stage0_form(asked0, xa, fp, act, stage_buf is not None, tma_store, plan.split0, kchunk, plan.fship, bm)
             if stage == 0 and s0 == "triton" else None)
    if form0 is not None:
        PATHS[f"cta_pipeline_mlp:symm:stage0_{form0}"] += 1

    def gemms():
        preloading = launcher.is_preloading()  # (only the Triton launches are preloaded: no cuBLAS work there)
        if preloading and "cublas" in (s0, s1):
            cta_cublas.preload(st, symm_layout.cta_block(False), symm_layout.cta_block(True))
        if stage == 0 and s0 == "cublas":
            if not preloading:
                blocks = stage_buf[:nch * mp * kchunk].view(nch, mp, kchunk)  # (the buffer may be larger)
                cta_cublas.stage0(xa, first, blocks, keep2d, plan, fp, activation, approximate, stage0_done)
            return
        if stage == 0:
            cta.launch_stage0(xa, *first, stage_buf, data, flags,
                              word(symm_layout.CTA_COUNTERS), word(symm_layout.CTA_DONE), epoch_word, idx, kchunk, nch,
                              base + symm_layout.CTA_ARRIVED, tp, tp, act, cfg0, st.num_sms, ready=ready, status=status,
                              timeout_ns=st.timeout_ns, rank=r, count_first_at_once=knobs.cta.COUNT_FIRST_GROUP_AT_ONCE,
                              fship=plan.fship, keep=keep, tail_group=plan.tail_group, tma_store=tma_store,
                              split_last=knobs.cta.STAGE0_SPLIT_LAST, split_k=plan.split0,
                              split_partials=split_partials, split_counters=word(symm_layout.CTA_Y_COUNTERS),
                              form=form0, stream_k_tail=True)
            return
        a = st.data_view(x.dtype, ((tp * nch + nch1) * mp, kchunk))
        if f1 and s0 == "cublas":
            if not preloading:
                cta_cublas.share(xa, first, a[tp * nch * mp:].view(nch1, mp, kchunk), plan, activation, approximate)
        elif f1:  # this rank's share of the first GEMM, into its own chunks (read after, in stream order)
            own = a[tp * nch * mp:].view(-1)
            cta.launch_stage0(xa, *first, own, data, flags,
                              word(symm_layout.CTA_COUNTERS), word(symm_layout.CTA_DONE), epoch_word, 0, kchunk, nch1,
                              base + symm_layout.CTA_ARRIVED, tp, tp, act, cfg0, st.num_sms, tma_store=tma_store)
        if s1 == "cublas":
            if not preloading:
                stage1_cublas(a.view(tp * nch + nch1, mp, kchunk))
            return
        cta.launch_stage1(a, placed.w2, placed.b2, out, data, flags, y_offset, word(symm_layout.CTA_ARRIVED),
                          word(symm_layout.CTA_Y_COUNTERS), epoch_word, status, st.timeout_ns, r, ws, M, fp, idx, kchunk,
                          nch, base + symm_layout.CTA_Y_DONE, tp, cfg1, st.num_sms, f1=f1, ready=ready, fship=plan.fship,
                          part=part, tail_flags=word(symm_layout.CTA_TAIL_ARRIVED), tail_group=plan.tail_group,
                          ship_before_tail=ship_first, split_k=plan.split1, split_partials=split_partials,
                          split_counters=word(symm_layout.CTA_Y_COUNTERS + tiles_m))

    keep2d = keep[:(mp - m0) * tail].view(mp - m0, tail) if keep is not None else None

    def stage0_done(g, j):
        """cuBLAS stage 0 staged block (g, j): its done flag (captured: once the consumers' READY is up)."""
        if g == j == 0:
            cflags.wait_ready(tp, tp)
        cflags.raise_done(g, j, nch)

    def stage1_cublas(a3):
        cflags.wait_ready(0, ws)
        cta_cublas.stage1(a3, placed.w2, placed.b2_lowp, out, plan, fp, idx,
                          part.view(tp, M, N // tp) if tail else None, ship_first, cflags.wait,
                          lambda r0, r1: cflags.ship_rows(out, r0, r1, idx, tp, y_offset, bm), cflags.after_push)

    def tails():
        """Stage 0: its tail's partial products, into the stage-1 ranks' buffers (stream order: after
        stage 0's kernel wrote ``keep``)."""
        if stage == 0 and tail:
            r0 = (idx + 1) * fp - tail - placed.tail_rows[0]
            cta.launch_tail(keep[:(mp - m0) * tail].view(mp - m0, tail), placed.w2_tail[r0:r0 + tail], data, flags,
                            part_offset, word(symm_layout.CTA_Y_COUNTERS), epoch_word, status, st.timeout_ns, r, M, idx,
                            base + symm_layout.CTA_TAIL_ARRIVED, tp, cfg1, st.num_sms, ready=ready, m0=m0,
                            keep_local=ship_first)

    def collect():
        if stage == 0 or tp > 1:
            y = st.data_view(x.dtype, (M, N), y_offset)
            cta.launch_collect(y, out, word(symm_layout.CTA_Y_DONE), epoch_word, status, st.timeout_ns, r, tp,
                               idx if stage == 1 else -1, bm, part=part if ship_first else None, m0=m0)

    # Every pointer argument is 16-byte aligned (x via tma_aligned, placed weights and views at whole
    # tiles, buffers from the allocator), so the kernel variants follow from this key alone.
    call_key = (plan_key, r, activation, approximate, shapes, x.device.index, st.timeout_ns, graph, s0, s1)
    def preload() -> bool:
        with launcher.preloading():  # compile and load before the stream waits below (codegen/launcher.py)
            gemms()
            tails()
            collect()
        return True

    if not graph:
        _cached(_preloaded_calls, call_key, preload)
    if graph:
        # Inside a captured graph every value baked into the graph repeats on each replay: the epoch
        # is counted on the device (begin_kernel) and READY is raised and awaited by the kernels; the
        # copy engine's pushes see it through their done flags (see _push_blocks).
        st.check_status()
        st.graph_pinned = True  # the graph holds the data buffer's and peer tables' addresses: never freed
        _captured = True  # ... and the staging buffers' (_staging_buffer)
        st.captured_call(compute, finished=False)
        cta.launch_begin(epoch_word, flags, base + symm_layout.CTA_READY, r, ws)
        epoch = None
        if stage_buf is not None:
            st.push_stream.wait_stream(compute)  # after begin_kernel, before stage 0 (not after it)
    else:
        epoch = st.begin(compute, "cta_pipeline_mlp")
        _cuda.write_value32(st.flag_addr(base + symm_layout.CTA_EPOCH), epoch, compute)
        # Stores into peers' buffers (stage 1's Y, stage 0's tiles without the copy engine) wait
        # until they started this call (READY), i.e. stopped reading those buffers in their previous op.
        writes_to = (range(tp, ws) if not staged else ()) if stage == 0 else [p for p in range(ws) if p != r]
        for p in writes_to:
            st.stream_wait(symm_layout.READY + p, epoch, compute)
    cflags = cta_cublas.CallFlags(st, base, epoch, compute, symm_layout.OP_CTA_STAGE1 if stage else symm_layout.OP_CTA_STAGE0)
    gemms()
    if stage_buf is not None:
        _push_blocks(st, stage_buf, epoch, idx, tp, M, mp, bm * group_m, groups, kchunk, nch, es, base,
                     plan.tail_group, plan.fship, fp)
    if stage == 0 and tail and not graph and staged:  # the tails store into the stage-1 ranks' buffers: READY first
        for p in range(tp, ws):
            st.stream_wait(symm_layout.READY + p, epoch, compute)
    tails()
    collect()
    if graph:
        if stage_buf is not None or (stage == 1 and s1 == "cublas"):  # (the cuBLAS stage 1 pushes its rows)
            compute.wait_stream(st.push_stream)
        st.stall_if_a_peer_gave_up(compute)
        st.captured_call(compute, finished=True)
    else:
        st.end(compute)
    return out


def _staging_buffer(x: Tensor, numel: int, what: str, dtype: torch.dtype | None = None) -> Tensor:
    """A rank's local buffers (``what``: stage 0's "blocks", the chunk-major blocks the copy engine
    ships, and "tail", its tail of A; "split", a stage's float32 split-K partial sums), of ``x``'s
    dtype unless ``dtype``. Reused: the next call's kernels run after this call's pushes, which
    ``GroupState.end`` orders before anything later on the compute stream."""
    dtype = dtype or x.dtype
    key = (x.device, dtype, what)
    buf = _staging.get(key)
    if buf is None or buf.numel() < numel:
        if buf is not None and _captured:  # a captured graph may still use the old one: keep it
            _staging_kept.append(buf)
        elif buf is not None and x.is_cuda:
            torch.cuda.synchronize(x.device)  # the old buffer's memory goes back to the allocator
        buf = _staging[key] = symm.persistent(lambda: torch.empty(numel, dtype=dtype, device=x.device), x.device)
    return buf


def _push_blocks(st, stage_buf, epoch, producer, tp, M, mp, group_rows, groups, kchunk, nch, es, base, tail_group,
                 fship, fp):
    """Copy engine: each (row group, K-chunk) block to every stage-1 rank as soon as stage 0's kernel
    raised its local done flag, then raise the consumer's flag; in the order the kernel makes them.
    Row group ``tail_group`` ships ``fship`` of the ``fp`` columns (the rest is its tail).

    ``epoch`` None: a call being captured in a CUDA graph, whose epoch is on the device and whose
    stream waits and writes bake their values in. Each done flag is then awaited for >= 1 and reset
    to 0 right after (the next replay's kernel raises it again: a stream wait for the epoch would
    pass on the previous replay's value), and the consumer's flag is raised by copying the epoch
    word into it behind the block's copy on the same stream. The consumers' READY need no stream
    wait: stage 0's kernel awaited it before raising any done flag."""
    row_bytes = kchunk * es
    src = stage_buf.data_ptr()
    stream = st.push_stream
    for g in range(groups):
        r0 = g * group_rows
        nbytes = (min(M, r0 + group_rows) - r0) * row_bytes
        for j in range(min(nch, -(-(fship if g == tail_group else fp) // kchunk))):
            done = st.flag_addr(base + symm_layout.CTA_DONE + g * nch + j)
            arrived = base + symm_layout.CTA_ARRIVED + (g * tp + producer) * nch + j
            dst, block = ((producer * nch + j) * mp + r0) * row_bytes, src + (j * mp + r0) * row_bytes
            _cuda.wait_value32(done, 1 if epoch is None else epoch, stream)
            if epoch is None:
                _cuda.write_value32(done, 0, stream)
            for q in range(tp):
                if epoch is not None:
                    st.push(tp + q, dst, block, nbytes, arrived)
                else:
                    _cuda.memcpy_async(st.data_addr(tp + q, dst), block, nbytes, stream)
                    _cuda.memcpy_async(st.flag_addr(arrived, tp + q), st.flag_addr(base + symm_layout.CTA_EPOCH), 4, stream)


def _cta_inputs(args) -> tuple[list, str]:
    x, w1, b1, w3, b3, w2, b2, *_, group_name = args
    return [t for t in (x, w1, b1, w3, b3, w2, b2) if t is not None], group_name


def _cta_values(args) -> tuple:
    """The weights' versions: a graph replays the placement it was captured with (``cta_weights``), so a
    weight changed in place since must run the op again, which lays the weights out anew."""
    x, w1, b1, w3, b3, w2, b2, *_ = args
    return cta_weights.versions((w1, b1, w3, b3, w2, b2))


cta_pipeline_mlp.bind_key = lambda: private_graphs.KeyGraphs("cta_pipeline_mlp", cta_pipeline_mlp, _cta_inputs,
                                                             _cta_values)
