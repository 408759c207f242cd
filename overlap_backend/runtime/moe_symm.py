"""The ``symm`` lowering of ``overlap::moe_experts``: copy-engine dispatch, a persistent grouped
SwiGLU producer, and a communication consumer on ``OVERLAP_MOE_COMM_SMS`` SMs (design: docs/moe.md).

One call on rank r (``epoch`` from ``GroupState.begin``; nothing is reset, the host never waits):

1. plan (torch ops on the device): sort the valid grouped rows by (source position, expert),
   remote sources first (r+1, r+2, ...), own rows last; per-group counts and tile prefix sums.
2. dispatch (push stream, copy engine): x's rows for rank d go into d's dispatch slot r, to r-1
   first; d's ``MOE_ARRIVED[r]`` rises after them. The own rows go into slot r (copy stream).
3. ``gate_up_kernel`` (compute stream, SM count - comm SMs): its tiles wait for the dispatch
   slot they read.
4. ``down_kernel`` (compute stream, same SMs) scatters rows into ``out`` (own rows) or the staging
   buffer (remote rows, received-row order) and raises ``MOE_DONE[pos]`` per source. In the
   remote-first order 3 and 4 are launched once per source position (``moe_gemm.phases``).
   Where both kernels measured slower than ``torch._grouped_mm`` (``knobs.moe.EXPERT_GEMM``), 3 and 4 are
   ``runtime/moe_grouped.py``'s grouped GEMMs instead, behind stream waits on the arrival flags.
5. the combine. By default (``OVERLAP_MOE_COMM_SMS=0``) the copy engine does all of it: per source
   it stream-waits for ``MOE_DONE`` and pushes the staging segment into the source's combine slot r,
   raising its ``MOE_RETURNED[r]``; per peer it stream-waits for ``MOE_RETURNED`` and copies the
   combine slot into ``out``. With comm SMs, ``comm_kernel`` (its own stream, from the start of the
   call) does the copy-out instead, and with ``knobs.moe.TRANSPORT = "sm"`` the pushes too.

Data buffer layout (every rank the same, see ``layout``): dispatch slots ``[ws, cap, H]`` then
combine slots ``[ws, cap, H]``, x's dtype, ``cap = x.shape[0]`` (a source sends a rank at most all
its rows). Hence the one requirement the other ops do not have: **x has the same number of rows on
every rank** (tokens x top_k, or experts x capacity, with the same token count per rank).
"""

from __future__ import annotations

import logging
import os

import torch
from torch import Tensor

from ..codegen import launcher
from ..spec import kernel_ratios, knobs, symm_layout
from . import cuda as _cuda
from . import moe_grouped, symm
from .lowering import register
from .symm import private_graphs
from .moe_p2p import prefix_sums
from .streams import SYMM_MOE_COMM, comm_stream
from .symm.lowering_helpers import (PATHS, call_state, capture_problem, captured_call_problem, capturing,
                                     eager_protocol_run, load_kernels, run_on_p2p, tma_aligned, tma_problem, tune,
                                     tuned_configs)

log = logging.getLogger("overlap_backend.symm")

COMPUTE_DTYPES = (torch.bfloat16, torch.float16)
DISABLED_WHY = "the symm moe_experts kernels are turned off (knobs.moe.ENABLED = False)"


def comm_sms() -> int:
    """The comm kernel's SMs for an op called without ``comm_sms``: ``knobs.moe.COMM_SMS``, else
    ``OVERLAP_MOE_COMM_SMS`` (read per call)."""
    if knobs.moe.COMM_SMS is not None:
        return knobs.moe.COMM_SMS
    from ..config import _parse_moe_comm_sms

    raw = os.environ.get("OVERLAP_MOE_COMM_SMS")
    value = 0 if raw is None else _parse_moe_comm_sms("OVERLAP_MOE_COMM_SMS", raw)
    return 0 if value == "auto" else value  # auto: the cost model passes its choice as the op's comm_sms


_comm_sms_setting = comm_sms  # moe_experts' ``comm_sms`` argument shadows the name


def expert_major(rows: int, ws: int, experts: int) -> bool:
    """Tile order: remote-critical first (sources r+1, r+2, ..., own last; groups (source, expert)),
    unless the groups are smaller than a tile on average (decode sizes): then expert-major, so
    that the tiles of one expert's sources run side by side and share its weights in L2 (the
    experts are weight-bandwidth bound there, and re-reading every expert's weights once per
    source would cost more than the overlap wins). A local choice: what is communicated and the
    results do not depend on it. ``knobs.moe.ORDER`` forces one ("source" / "expert")."""
    if knobs.moe.ORDER != "auto":
        return knobs.moe.ORDER == "expert"
    return rows < ws * experts * knobs.moe.EXPERT_MAJOR_ROWS


def combine_transport(comm_sms: int, graph: bool, cuda: bool = True) -> tuple[str, int, int]:
    """(transport, SMs its comm kernel holds, SMs an eager call's holds) of a call; ``comm_sms``: the
    op's argument (-1: the setting). 0 SMs: no comm kernel ("ce-only"), whatever knobs.moe.TRANSPORT says. A
    captured call takes the copy-engine-only combine: with the comm kernel's copy-out, replays of the
    DeepSeek-like layer took 8.96 ms against 5.65 without it (2xH200, the copy-out ended ~3.5 ms after
    the last GEMM in a replay, 0.4 ms eagerly); and its peers' READY words are consumed by begin(),
    which the comm kernel's pushes ("sm") would wait on. The interpreter (not ``cuda``) always runs the
    comm kernel, pushes included, on at least one program. Block configs are tuned by eager calls,
    for the grid their SMs leave (a captured call uses theirs)."""
    requested = comm_sms if comm_sms >= 0 else _comm_sms_setting()
    eager = "ce-only" if requested == 0 else knobs.moe.TRANSPORT
    transport = "ce-only" if graph else eager

    def held(t: str) -> int:
        if not cuda:
            return max(1, requested)
        return 0 if t == "ce-only" else requested

    return transport, held(transport), held(eager)


def gemm_schedule(ws: int, experts: int, major: bool) -> tuple[list[tuple[int, int, int, int]], int | None]:
    """The gate/up + down launch pairs of a call (``moe_gemm.phases``' tuples) and the group the
    single-launch schedules start at (None: the first): ``knobs.moe.SCHEDULE`` "phased" (one pair per
    source position) or "rotated" (one pair, own groups first), and one expert-major pair at decode sizes."""
    from ..codegen import moe_gemm

    schedule = knobs.moe.SCHEDULE
    if schedule == "rotated" or major:
        # the own groups (source position ws - 1) first: their rows are local, the peers' are in flight
        return [(0, ws * experts, 0, ws)], None if major else (ws - 1) * experts
    if schedule == "phased":
        return moe_gemm.phases(ws, experts, False, knobs.moe.OWN_FIRST), None
    raise ValueError(f"knobs.moe.SCHEDULE must be 'rotated' or 'phased', not {schedule!r}")


def layout(ws: int, cap: int, h: int, elem: int) -> dict:
    """Byte offsets of the dispatch and combine regions in every rank's data buffer."""
    slot = cap * h * elem
    return {"slot": slot, "disp": 0, "comb": ws * slot, "bytes": 2 * ws * slot}


def problem(x: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor, rows: Tensor, saved) -> str | None:
    """Why the kernels do not cover this call (None: they do); shapes, dtypes and args only."""
    if x.device.type != "cuda":
        return "not a CUDA tensor"
    if any(saved):
        return "tensors saved for backward requested (training forward)"
    if w_gate.dtype not in COMPUTE_DTYPES:
        return f"compute dtype {w_gate.dtype} (kernels: bfloat16, float16)"
    if x.dtype not in symm_dtypes():
        return f"token dtype {x.dtype}"
    if x.dim() != 2 or rows.dim() != 1:
        return "x is not 2-D or rows not 1-D"
    return tma_problem(x.dtype, x.shape[1]) or tma_problem(w_gate.dtype, w_gate.shape[1], w_gate.shape[2])


def kernel_expert_weight(w: Tensor) -> Tensor:
    """``w`` [E, K, N] as the GEMM kernels read it in place (``moe_gemm.expert_layout``): N or K
    contiguous per expert with 16-byte aligned strides and base, as are the halves of a fused gate/up
    weight (``[E, K, 2N]`` or ``F.linear``'s ``[E, 2N, K]``) and ``F.linear``'s transposed weights;
    any other view is copied contiguous (per call)."""
    es = w.element_size()
    if w.data_ptr() % 16 == 0 and (w.stride(0) * es) % 16 == 0 and (
            (w.stride(2) == 1 and (w.stride(1) * es) % 16 == 0) or (w.stride(1) == 1 and (w.stride(2) * es) % 16 == 0)):
        return w
    return tma_aligned(w)


def symm_dtypes():
    return (torch.bfloat16, torch.float16, torch.float32)


def plan(rows: Tensor, ends: Tensor, recv_off: Tensor, rank: int, ws: int, experts: int, block_rows,
         expert_major: bool = False) -> dict:
    """Device-side work list (no host read): ``codegen/moe_plan.py``'s one kernel where it applies
    (decode sizes: host time is most of such a layer), else ``plan_reference``'s torch ops."""
    from ..codegen import moe_plan

    span = expert_major and knobs.moe.SPAN_SOURCES  # (the kernels read it from the plan: moe_gemm.spans_sources)
    if knobs.moe.PLAN_KERNEL and not moe_plan.unsupported(rows.shape[0], ws * experts, block_rows):
        return moe_plan.plan(rows, ends, recv_off, rank, ws, experts, block_rows, expert_major, span)
    return plan_reference(rows, ends, recv_off, rank, ws, experts, block_rows, expert_major, span)


def plan_reference(rows: Tensor, ends: Tensor, recv_off: Tensor, rank: int, ws: int, experts: int, block_rows,
                   expert_major: bool = False, span: bool = False) -> dict:
    """Device-side work list (no host read), from torch ops. ``recv_off`` [ws + 1] int32, ``ends`` [E] cumulative ends.

    Returns ``srows`` (received-row index of each sorted row), ``counts``/``row_start``/``contig``
    (rows are consecutive received rows) per group ``pos * E + e`` (``e * ws + pos`` with
    ``expert_major``), and per block height BM: ``tile_start[BM]`` ([G + 1] prefix of row tiles) and
    ``src_tiles[BM]`` ([ws] row tiles per source position); with ``span`` (expert-major only), also the row tiles
    that span an expert's sources (``knobs.moe.SPAN_SOURCES``): ``span_start[BM]`` ([E + 1] prefix of each expert's
    row tiles) and ``span_src[BM]`` ([ws] per source position, the row tiles holding any of its rows); empty
    without."""
    assert expert_major or not span, "tiles span an expert's sources in the expert-major order only"
    dev = rows.device
    m = rows.shape[0]
    rows = rows.to(torch.long)
    j = torch.arange(m, device=dev)
    expert = torch.searchsorted(ends.to(torch.long), j, right=True)
    source = torch.searchsorted(recv_off[1:].to(torch.long), rows, right=True)
    pos = (source - rank - 1) % ws
    groups = ws * experts
    g = expert * ws + pos if expert_major else pos * experts + expert
    key = torch.where((rows >= 0) & (expert < experts), g, groups)
    key_sorted, order = torch.sort(key, stable=True)
    # (scatter_add, not bincount: CUDA bincount reads the input's max on the host, a synchronisation)
    counts = torch.zeros(groups + 1, dtype=torch.long, device=dev).scatter_add_(0, key, torch.ones_like(key))[:groups]
    row_start = torch.cumsum(counts, 0) - counts
    srows = rows[order]
    # contig[g]: the group's rows are consecutive received rows (srows[p] - p constant in the group)
    step = srows - j
    lo = torch.full((groups + 1,), m + 1, dtype=torch.long, device=dev).scatter_reduce(0, key_sorted, step, "amin")
    hi = torch.full((groups + 1,), -m - 1, dtype=torch.long, device=dev).scatter_reduce(0, key_sorted, step, "amax")
    out = {
        "contig": ((lo == hi)[:groups] | (counts == 0)).to(torch.int32),
        "srows": srows.to(torch.int32),
        "counts": counts.to(torch.int32),
        "row_start": row_start.to(torch.int32),
        "recv_off": recv_off,
        "expert_major": expert_major,
        "tile_start": {},
        "src_tiles": {},
        "span_start": {},
        "span_src": {},
    }
    zero = torch.zeros(1, dtype=torch.long, device=dev)
    for bm in set(block_rows):
        tiles = (counts + bm - 1) // bm
        out["tile_start"][bm] = torch.cat([zero, torch.cumsum(tiles, 0)]).to(torch.int32)
        per = tiles.view(experts, ws).sum(0) if expert_major else tiles.view(ws, experts).sum(1)
        out["src_tiles"][bm] = per.to(torch.int32)
        if span:
            out["span_start"][bm], out["span_src"][bm] = span_tiles(counts, row_start, ws, experts, bm)
    return out


def span_tiles(counts: Tensor, row_start: Tensor, ws: int, experts: int, bm: int) -> tuple[Tensor, Tensor]:
    """Expert-major groups' row tiles of height ``bm`` that span an expert's sources: ([E + 1] prefix of each expert's
    row tiles, [ws] per source position the tiles holding any of its rows)."""
    per_expert = counts.view(experts, ws).sum(1)
    start = torch.cat([per_expert.new_zeros(1), torch.cumsum((per_expert + bm - 1) // bm, 0)]).to(torch.int32)
    first = row_start - row_start.view(experts, ws)[:, :1].expand(experts, ws).reshape(-1)  # row in its expert
    touched = torch.where(counts > 0, (first + counts - 1) // bm - first // bm + 1, 0)
    return start, touched.view(experts, ws).sum(0).to(torch.int32)


@register("symm", "moe_experts")
def moe_experts(x, send_splits, recv_splits, rows, offsets, group_sizes, w_gate, w_up, w_down, group_name, saved,
                comm_sms=-1):
    args = (x, send_splits, recv_splits, rows, offsets, group_sizes, w_gate, w_up, w_down, group_name, saved)
    why = (problem(x, w_gate, w_up, w_down, rows, saved) or (None if knobs.moe.ENABLED else DISABLED_WHY)
           or capture_problem(x))
    graph = why is None and capturing(x)
    st, why = (None, why) if why else call_state(group_name, x.device, graph)
    if st is None:
        return run_on_p2p("moe_experts", why, group_name, *args)
    from ..codegen import moe_comm, moe_gemm

    ws, r = st.ws, st.rank
    send_splits, recv_splits = [int(s) for s in send_splits], [int(s) for s in recv_splits]
    experts, h, f = w_gate.shape
    dev, es, cd = x.device, x.element_size(), w_gate.dtype
    cap = max(1, x.shape[0])
    lay = layout(ws, cap, h, es)
    m = rows.shape[0]
    transport, sms, eager_sms = combine_transport(comm_sms, graph, x.is_cuda)
    ce_only = transport == "ce-only" and x.is_cuda  # no comm kernel: every SM computes
    grid = max(1, st.num_sms - sms)
    # rows vary per call (dropless): configs tuned once per power-of-two bucket of them
    eager_grid = max(1, st.num_sms - eager_sms)
    tune_key = (1 << max(0, m - 1).bit_length(), h, f, experts, ws, str(x.dtype), str(cd), eager_grid)
    send_off, recv_off = prefix_sums(send_splits), prefix_sums(recv_splits)
    ends_host = [] if offsets is not None else prefix_sums(group_sizes)[1:]
    meta = _meta(send_off + recv_off + ends_host, dev, graph and not eager_protocol_run(x))
    grouped, _ = moe_grouped.choose(x, w_gate, w_up, w_down, ws, sms)  # (its reason is logged once)
    tuned = [] if grouped else [tuned_configs.get(("moe_gate_up", tune_key)), tuned_configs.get(("moe_down", tune_key))]
    if graph and (why := captured_call_problem(st, lay["bytes"], tuned)
                  or (meta is None and "inside a CUDA-graph capture with splits no eager call used (warm up "
                                       "eagerly first)")):
        return run_on_p2p("moe_experts", why, group_name, *args)
    PATHS["moe_experts:symm"] += 1
    PATHS["moe_experts:symm:" + ("grouped_mm" if grouped else "triton")] += 1
    load_kernels()  # Triton's allocator (scratch for device-side descriptors), as the other ops
    # inputs validated by the op (runtime/checks.py)
    x = tma_aligned(x)
    w_gate, w_up, w_down = (kernel_expert_weight(w) for w in (w_gate, w_up, w_down))
    st.ensure_data(lay["bytes"], "moe_experts")
    disp = st.data_view(x.dtype, (ws * cap, h), lay["disp"])
    comb = st.data_view(x.dtype, (ws * cap, h), lay["comb"])
    send_off_d, recv_off_d = meta[: ws + 1], meta[ws + 1 : 2 * ws + 2]
    ends = offsets if offsets is not None else meta[2 * ws + 2 :]
    n_recv = recv_off[-1]
    # A captured call's flags toggle in the graph block (symm_layout.GRAPH_BLOCK: raised to 1, reset at its end)
    base = symm_layout.GRAPH_BLOCK if graph else 0
    cands_a = moe_gemm.candidates(cd, "gate_up")
    # the down GEMM's tuned config, or before tuning the benchmark's variant near the shape (the ratios read once)
    tuned_b = tuned[1] if tuned else None
    cands_b = moe_gemm.candidates(cd, "down", tuned_b if tuned_b is not None else
                                  kernel_ratios.measured_variant("moe_down", m, f, h, ws=ws, dtype=cd))
    cfg_a, cfg_b = cands_a[0], cands_b[0]
    major = expert_major(m, ws, experts)
    if grouped:  # segments: one per source position (phased, remote-first), or one of everything
        per_source = not major and knobs.moe.SCHEDULE == "phased"
        gpl = moe_grouped.plan(rows, ends, recv_off_d, r, ws, experts, n_recv, cap, per_source) if n_recv else None
    else:
        pl = plan(rows, ends, recv_off_d, r, ws, experts, [c[0] for c in cands_a + cands_b], major)
        act = x.new_empty((max(m, 1), f), dtype=cd)
    stage = x.new_empty((max(n_recv, 1), h))
    out = x.new_empty(x.shape)
    flag = lambda word: st.flag_arg(base + word)  # noqa: E731
    status = st.status_arg()

    gemm_phases, own_start = ([], None) if grouped else gemm_schedule(ws, experts, pl["expert_major"])

    def gate_up(cfg, epoch, phase=None):
        moe_gemm.launch_gate_up(disp, w_gate, w_up, act, pl, flag(symm_layout.MOE_ARRIVED), st.flag_arg(symm_layout.MOE_CAP), epoch,
                                status, st.timeout_ns, r, ws, cap, cfg, grid, timed=x.is_cuda, phase=phase,
                                start_group=own_start)

    def down(cfg, epoch, phase=None):
        moe_gemm.launch_down(act, w_down, out, stage, pl, flag(symm_layout.MOE_COUNTERS), flag(symm_layout.MOE_DONE),
                             epoch, r, ws, send_off[r], cfg, grid, phase=phase)

    if x.is_cuda and not grouped:  # tune on the real problem with every flag raised (epoch 0: no communication)
        # (a captured call: tuned by an eager call, checked above; tune only looks it up)
        cfg_a = tune("moe_gate_up", tune_key, cands_a, lambda c: gate_up(c, 0))
        if tuned_b is None:
            cands_b = [c for c in cands_b if moe_gemm.down_unsupported(c, act, w_down, out, stage) is None]
        cfg_b = tune("moe_down", tune_key, cands_b, lambda c: down(c, 0))

    compute = torch.cuda.current_stream(dev) if x.is_cuda else None
    data_tab, flag_tab = st.peer_tables()  # (built on the compute stream: before the comm stream's wait)

    def launch_comm(epoch):
        moe_comm.launch(stage, comb, out, data_tab, flag_tab, recv_off_d, send_off_d, flag(symm_layout.MOE_DONE),
                        flag(symm_layout.MOE_PUSHED), flag(symm_layout.READY), flag(symm_layout.MOE_RETURNED), epoch, status,
                        st.timeout_ns, r, ws, cap, lay["comb"] // es, base + symm_layout.MOE_RETURNED, sms,
                        push=transport == "sm" or not x.is_cuda, timed=x.is_cuda)

    # Compile and load every kernel first: the comm kernel spins until the GEMMs launched after it
    # finish, and loading a kernel may synchronise the context (codegen/launcher.py).
    with launcher.preloading():
        if not ce_only:
            launch_comm(0)
        for phase in gemm_phases:
            gate_up(cfg_a, 0, phase)
            down(cfg_b, 0, phase)
    epoch = st.begin(compute, "moe_experts", graph=graph)
    begun = _record(compute)
    row_bytes = h * es
    for j in range(1, ws):  # dispatch, to r-1 first: rank d takes source d+1 first
        d = (r - j) % ws
        to_d = st.push_stream_to(d)
        if x.is_cuda:  # this rank's slot stride for d's check, once d has read the last call's (READY); the
            # dispatch flag's write after it fences it (the interpreter tests pre-set the words instead)
            st.wait_ready(d, to_d)
            _cuda.write_value32(st.flag_addr(symm_layout.MOE_CAP + r, d), cap, to_d)
        st.push(d, lay["disp"] + r * lay["slot"], x.data_ptr() + send_off[d] * row_bytes, send_splits[d] * row_bytes,
                symm_layout.MOE_ARRIVED + r, to_d)
    side = st.copy_stream
    with _on(side):
        # this rank's own rows into its own slot, then its arrival flag
        if x.is_cuda:
            if send_splits[r]:
                _cuda.memcpy_async(disp.data_ptr() + r * cap * row_bytes, x.data_ptr() + send_off[r] * row_bytes,
                                   send_splits[r] * row_bytes, side)
        else:
            disp[r * cap : r * cap + send_splits[r]].copy_(x[send_off[r] : send_off[r + 1]])
        _raise_local(st, base + symm_layout.MOE_ARRIVED + r, epoch, side)
        own_copied = _record(side)
        # received rows no grouped row points at are 0: zero the staging rows and own output rows (the
        # grouped_mm form writes every one of them)
        if not grouped:
            stage.zero_()
            out[send_off[r] : send_off[r + 1]].zero_()
        zeroed = _record(side)
    # The comm kernel starts now (after this call's begin) and spins on its SMs until the down
    # GEMM finishes each source; the GEMMs run on the other SMs.
    comm = comm_stream(dev.index, SYMM_MOE_COMM) if x.is_cuda and not ce_only else None
    _wait(comm, begun)

    if comm is not None:
        with _on(comm):
            launch_comm(epoch)
    if grouped:
        _grouped_experts(st, gpl, per_source, disp, w_gate, w_up, w_down, out, stage, send_off, recv_off, epoch, base,
                         own_copied, compute)
    for i, phase in enumerate(gemm_phases):
        if i == 0 and phase[2] <= ws - 1 < phase[3]:
            # A copy within one GPU runs as a kernel on the SMs, not on a copy engine
            # (bench/probe_copy_sms.py): a gate/up kernel holding every SM while it waits for the own rows
            # could keep that copy from ever starting. So a first launch that takes the own rows waits
            # for them on the stream; later launches come after `zeroed` below.
            _wait(compute, own_copied)
        gate_up(cfg_a, epoch, phase)
        if i == 0:
            _wait(compute, zeroed)
        down(cfg_b, epoch, phase)
    if comm is None and not ce_only:  # the interpreter runs kernels one after the other: the comm kernel last
        launch_comm(epoch)
    if transport in ("ce", "ce-only") and x.is_cuda:
        for pos in range(ws - 1):
            s = (r + 1 + pos) % ws
            st.stream_wait(base + symm_layout.MOE_DONE + pos, epoch, st.push_stream_to(s))
            st.push(s, lay["comb"] + r * lay["slot"], stage.data_ptr() + recv_off[s] * row_bytes,
                    recv_splits[s] * row_bytes, symm_layout.MOE_RETURNED + r, st.push_stream_to(s))
    if ce_only:  # the peers' results for this rank's rows, out of the combine slots as each arrives
        for j in range(1, ws):
            d = (r - j) % ws  # rank r-1 computes them first
            st.stream_wait(base + symm_layout.MOE_RETURNED + d, epoch, st.copy_stream)
            if send_splits[d]:
                _cuda.memcpy_async(out.data_ptr() + send_off[d] * row_bytes, comb.data_ptr() + d * cap * row_bytes,
                                   send_splits[d] * row_bytes, st.copy_stream)
    if comm is not None:
        compute.wait_stream(comm)
    st.end(compute)
    return out, [x.new_empty((0,)) for _ in saved]


def _grouped_experts(st, gpl, per_source, disp, w_gate, w_up, w_down, out, stage, send_off, recv_off, epoch, base,
                     own_copied, compute) -> None:
    """The expert GEMMs by ``torch._grouped_mm`` (``moe_grouped``) on the compute stream, segment by
    segment in the remote-first order: wait for the segment's dispatch (a stream memory wait on its
    arrival flag; the own rows: their copy's event), compute, scatter into ``out`` / ``stage``, and raise
    ``MOE_DONE`` of its remote positions by a stream write for the combine."""
    ws, r = st.ws, st.rank
    gate_up = moe_grouped.gate_up_weights(w_gate, w_up)
    own = out[send_off[r] : send_off[r + 1]]
    for seg_index, positions, lo, hi in moe_grouped.schedule(ws, recv_off, per_source, r):
        for pos in positions:
            s = (r + 1 + pos) % ws
            if s == r:
                _wait(compute, own_copied)
            elif compute is not None:  # (the interpreter tests pre-set the flags)
                st.stream_wait(base + symm_layout.MOE_ARRIVED + s, epoch, compute)
        if hi > lo:
            y = moe_grouped.experts(gpl, seg_index, lo, hi, disp, gate_up, w_down).to(stage.dtype)
            if positions == [ws - 1]:  # the own rows, straight into out
                own.index_copy_(0, gpl["seg"][lo:hi] - lo, y)
            else:
                stage.index_copy_(0, gpl["seg"][lo:hi], y)
                if ws - 1 in positions:
                    own.copy_(stage[recv_off[r] : recv_off[r + 1]])
        for pos in positions:
            if pos < ws - 1:
                _raise_local(st, base + symm_layout.MOE_DONE + pos, epoch, compute)
    if ws > 1:  # the peers' row counts, once the compute stream has waited for every dispatch
        from ..codegen import moe_caps

        moe_caps.launch(st.flag_arg(symm_layout.MOE_CAP), st.status_arg(), r, ws, disp.shape[0] // ws)


_metas: dict[tuple, Tensor] = {}


def _meta(values: list[int], device: torch.device, graph: bool) -> Tensor | None:
    """The call's offsets as an int32 device tensor. Each distinct list is kept on the device
    (capacity routing sends the same splits every call: no copy then), made with
    ``symm.persistent`` (outside any CUDA-graph pool). A captured call only uses a kept one (None
    if there is none: a replay would copy from host memory freed after the capture); past
    ``knobs.moe.META_MAX`` lists, eager calls copy theirs (pinned, non-blocking: a pageable copy would
    synchronise the stream) without keeping it."""
    key = (device.index, tuple(values))
    t = _metas.get(key)
    if t is not None or graph:
        return t
    host = torch.tensor(values, dtype=torch.int32, pin_memory=device.type == "cuda")
    if len(_metas) >= knobs.moe.META_MAX:
        return host.to(device, non_blocking=True)
    t = _metas[key] = symm.persistent(lambda: host.to(device, non_blocking=True), device)
    return t


def _raise_local(st, word: int, epoch: int, stream) -> None:
    """This rank's own flag ``word`` = epoch, after the work queued on ``stream``."""
    if stream is None:  # the interpreter tests' fake group: CPU flag tensor
        st.flag_arg(word)[0] = epoch
    else:
        _cuda.write_value32(st.flag_addr(word), epoch, stream)


# Stream helpers that do nothing off CUDA (the interpreter tests run this path on CPU tensors).
class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _on(stream):
    return torch.cuda.stream(stream) if stream is not None else _Null()


def _record(stream):
    if stream is None:
        return None
    ev = torch.cuda.Event()
    ev.record(stream)
    return ev


def _wait(stream, event):
    if stream is not None and event is not None:
        stream.wait_event(event)


def _moe_inputs(args) -> tuple[list, str]:
    x, _, _, rows, offsets, _, w_gate, w_up, w_down, group_name, *_ = args
    return [t for t in (x, rows, offsets, w_gate, w_up, w_down) if t is not None], group_name


def _moe_values(args) -> tuple:
    x, send_splits, recv_splits, rows, _, group_sizes, *_ = args
    return (x.shape[0], rows.shape[0], tuple(send_splits), tuple(recv_splits), tuple(group_sizes))


moe_experts.bind_key = lambda: private_graphs.KeyGraphs("moe_experts", moe_experts, _moe_inputs, _moe_values)
