"""The ``symm`` lowering of ``moe_experts`` under ``TRITON_INTERPRET=1`` (CPU), one rank at a time.

Each test plays rank ``r`` of a ``ws``-rank group: what the peers would have delivered (dispatch
rows, returned results) is written into this rank's buffers beforehand and the arrival flags are
pre-set to the epoch; every peer has a buffer of its own (a CPU tensor) so that the communication
kernel's peer stores land where they can be checked. Checked against float32 references: the
device-side plan and tile map (groups sorted remote-first, empty experts, skew), the grouped
gate/up and down GEMMs, the down GEMM's scatter into received-row positions, the per-source tile
counters and done flags, the communication kernel's push/pull with flags, and the whole Python
path (``moe_symm.moe_experts`` with a fake GroupState) against the op's semantics.

The expert weights (the compute dtype) are float16 here: the interpreter's ``tl.dot`` gets
bfloat16 operands wrong (Triton 3.9, numpy has no bfloat16: a bf16 16x16x16 dot is off by 1e10,
fp16/fp32 exact); bfloat16 tokens are covered (converted in the kernel), bf16 dots run on GPU.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("interpreter tests: they run where CUDA is absent (CI)", allow_module_level=True)
triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from overlap_backend.codegen import moe_comm, moe_gemm  # noqa: E402
from overlap_backend.runtime import moe_symm, symm  # noqa: E402
from overlap_backend.spec import knobs, symm_layout  # noqa: E402

EPOCH = 7


@pytest.fixture(autouse=True)
def _cpu_allocator(monkeypatch):
    """Device-side TMA descriptors take scratch memory from Triton's allocator: CPU tensors here."""
    from overlap_backend.runtime.symm import lowering_helpers

    alloc = lambda size, align, stream: torch.empty(size, dtype=torch.int8)  # noqa: E731
    monkeypatch.setattr(lowering_helpers, "tma_scratch", alloc)
    triton.set_allocator(alloc)
CFG = (16, 16, 16, 2, 1, 1, False)  # BM, BN, BK, GROUP_M (stages, warps unused by the interpreter)


def _prefix(sizes):
    out = [0]
    for s in sizes:
        out.append(out[-1] + s)
    return out


def _case(ws, rank, experts, h, f, gen, skew=False, empty=(), send=None, recv=None, idle=0, sorted_sources=False):
    """Random splits and a grouped row map as the MoE layer makes them (expert-major, source order
    inside an expert); ``idle`` grouped rows past the last expert's end; ``sorted_sources``: every
    source sent its rows sorted by expert (as the layer does: each group is consecutive received
    rows, the TMA path), else experts are drawn per row (the gather path); returns a dict."""
    if recv is None:
        recv = [int(v) for v in torch.randint(0, 20, (ws,), generator=gen)]
    n_recv = sum(recv)
    if skew:
        expert_of = torch.zeros(n_recv, dtype=torch.long)
        expert_of[: n_recv // 8] = torch.randint(0, experts, (n_recv // 8,), generator=gen)
    else:
        expert_of = torch.randint(0, experts, (n_recv,), generator=gen)
    for e in empty:
        expert_of[expert_of == e] = (e + 1) % experts
    if sorted_sources:
        offs = _prefix(recv)
        for s in range(ws):
            expert_of[offs[s] : offs[s + 1]] = expert_of[offs[s] : offs[s + 1]].sort().values
    order = torch.sort(expert_of, stable=True).indices
    sizes = torch.bincount(expert_of, minlength=experts)
    rows = torch.cat([order, torch.randint(0, max(n_recv, 1), (idle,), generator=gen)]) if n_recv else order
    if send is None:
        send = [int(v) for v in torch.randint(0, 20, (ws,), generator=gen)]
    send[rank] = recv[rank]
    return dict(recv=recv, send=send, rows=rows, sizes=sizes.tolist(), ends=torch.cumsum(sizes, 0))


def _weights(experts, h, f, gen, dtype):
    wg = (torch.randn(experts, h, f, generator=gen) / math.sqrt(h)).to(dtype)
    wu = (torch.randn(experts, h, f, generator=gen) / math.sqrt(h)).to(dtype)
    wd = (torch.randn(experts, f, h, generator=gen) / math.sqrt(f)).to(dtype)
    return wg, wu, wd


def _reference_yr(recv_rows, rows, ends, wg, wu, wd):
    """Yr of the op's semantics, in float32 (recv_rows: [N_recv, H] received rows)."""
    n_recv, h = recv_rows.shape
    yr = torch.zeros(n_recv, h)
    experts = wg.shape[0]
    for j, q in enumerate(rows.tolist()):
        e = int(torch.searchsorted(ends, torch.tensor(j), right=True))
        if q < 0 or e >= experts:
            continue
        xg = recv_rows[q].to(wg.dtype).float()
        a = F.silu(xg @ wg[e].float()) * (xg @ wu[e].float())
        yr[q] = a.to(wg.dtype).float() @ wd[e].float()
    return yr


def _rel(a, b):
    a, b = a.double(), b.double()
    assert torch.isfinite(a).all()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


# --------------------------------------------------------------------------- plan and tile map
@triton.jit
def _tile_map_probe(out_ptr, srows_ptr, counts_ptr, row_start_ptr, tile_start_ptr, tiles_n, G, E,
                    LOG_G: tl.constexpr, BM: tl.constexpr, WS: tl.constexpr, EXPERT_MAJOR: tl.constexpr,
                    GROUP_M: tl.constexpr):
    t = tl.program_id(0)
    g, e, pos, pid_n, first, offs_p, mask, srow = moe_gemm.tile_rows(t, tiles_n, tile_start_ptr, row_start_ptr,
                                                                     counts_ptr, srows_ptr, G, E, LOG_G, BM, WS,
                                                                     EXPERT_MAJOR, GROUP_M)
    tl.store(out_ptr + t * 6 + 0, g)
    tl.store(out_ptr + t * 6 + 1, e)
    tl.store(out_ptr + t * 6 + 2, pos)
    tl.store(out_ptr + t * 6 + 3, pid_n)
    tl.store(out_ptr + t * 6 + 4, tl.sum(mask.to(tl.int32)))
    tl.store(out_ptr + t * 6 + 5, first - tl.load(row_start_ptr + g))  # the tile's first row in its group


def _grouped_order(tiles_m, tiles_n, group_m):
    """(row tile, column tile) in the order ``tiles.grouped_tile`` walks one group's tiles."""
    order = []
    for first in range(0, tiles_m, group_m):
        size = min(group_m, tiles_m - first)
        order += [(first + m, n) for n in range(tiles_n) for m in range(size)]
    return order


@pytest.mark.parametrize("skew,expert_major,group_m", [(False, False, 1), (False, False, 2), (True, False, 3),
                                                         (True, True, 2), (False, True, 3)],
                         ids=["balanced", "balanced-grouped", "skewed-grouped", "skewed-expert-major-grouped",
                              "balanced-expert-major-grouped"])
@pytest.mark.parametrize("ws,rank", [(2, 0), (4, 2)])
def test_plan_and_tile_map(ws, rank, skew, expert_major, group_m):
    """Groups come remote-first (sources rank+1, rank+2, ..., own last), expert order inside (or
    expert-major, source order inside); every valid grouped row appears once; tile t maps to the
    group, expert, source position, column tile and rows that a host-side enumeration gives
    (``group_m`` row tiles at a time inside a group, or expert-major inside an expert's groups, across its
    sources), empty experts and empty sources included."""
    gen = torch.Generator().manual_seed(ws * 10 + rank + skew)
    experts = 3
    case = _case(ws, rank, experts, 8, 8, gen, skew=skew, empty=(1,), idle=3)
    recv_off = torch.tensor(_prefix(case["recv"]), dtype=torch.int32)
    bm = 4
    pl = moe_symm.plan(case["rows"], case["ends"], recv_off, rank, ws, experts, [bm], expert_major)
    srows, counts = pl["srows"].long(), pl["counts"].tolist()

    def pos_expert(g):
        return divmod(g, experts) if not expert_major else tuple(reversed(divmod(g, ws)))

    # every valid grouped row once, grouped by (position, expert)
    valid = case["rows"][: int(case["ends"][-1])]
    assert sorted(srows[: sum(counts)].tolist()) == sorted(valid.tolist())
    expert_of_row = torch.searchsorted(case["ends"], torch.arange(len(case["rows"])), right=True)
    row_expert = {int(q): int(expert_of_row[j]) for j, q in enumerate(case["rows"].tolist()) if j < int(case["ends"][-1])}
    for g, (lo, c) in enumerate(zip(pl["row_start"].tolist(), counts)):
        pos, e = pos_expert(g)
        src = (rank + 1 + pos) % ws
        for q in srows[lo : lo + c].tolist():
            assert recv_off[src] <= q < recv_off[src + 1] and row_expert[q] == e
    assert [counts[g] for g in range(ws * experts) if pos_expert(g)[1] == 1] == [0] * ws  # expert 1 empty
    # tile map
    tiles_n = 3
    ts = pl["tile_start"][bm]
    expect = []
    # the walk's spans: a group (remote-first), or an expert's ws groups (expert-major), whose row tiles go
    # group_m at a time across the span's groups
    spans = [[g] for g in range(len(counts))] if not expert_major else [
        list(range(e * ws, (e + 1) * ws)) for e in range(experts)]
    for span in spans:
        row_tiles = [(g, m) for g in span for m in range(-(-counts[g] // bm))]
        for i, n in _grouped_order(len(row_tiles), tiles_n, group_m):
            g, m = row_tiles[i]
            expect.append((g, pos_expert(g)[1], pos_expert(g)[0], n, min(bm, counts[g] - m * bm), m * bm))
    assert int(ts[-1]) * tiles_n == len(expect)
    assert pl["src_tiles"][bm].tolist() == [sum(-(-c // bm) for g, c in enumerate(counts) if pos_expert(g)[0] == p)
                                            for p in range(ws)]
    if expect:
        out = torch.full((len(expect) * 6,), -1, dtype=torch.int32)
        G = ws * experts
        _tile_map_probe[(len(expect),)](out, pl["srows"], pl["counts"], pl["row_start"], ts, tiles_n, G, experts,
                                        LOG_G=moe_gemm.log_groups(G), BM=bm, WS=ws, EXPERT_MAJOR=expert_major,
                                        GROUP_M=group_m)
        assert [tuple(v) for v in out.view(-1, 6).tolist()] == expect


@pytest.mark.parametrize("ws,rank,experts,skew,expert_major,bms", [
    (2, 0, 3, False, False, (16,)), (2, 1, 4, True, False, (64, 128)), (3, 2, 5, False, True, (4, 16)),
    (4, 1, 2, True, True, (128,)), (4, 3, 7, False, False, (16, 64))])
def test_plan_kernel_matches_torch_plan(ws, rank, experts, skew, expert_major, bms):
    """``codegen/moe_plan.py``'s one kernel gives the torch reference's work list: the same groups,
    the same stable order of rows inside them, contig flags and tile prefixes, with rows that
    point nowhere (-1), rows past the last expert's end, empty experts and an empty source."""
    from overlap_backend.codegen import moe_plan

    gen = torch.Generator().manual_seed(ws * 100 + rank * 10 + experts)
    case = _case(ws, rank, experts, 8, 8, gen, skew=skew, empty=(1,), idle=5, sorted_sources=not skew)
    if skew:
        case["recv"][(rank + 1) % ws] = 0
        case = _case(ws, rank, experts, 8, 8, gen, skew=True, empty=(1,), idle=5, send=case["send"],
                     recv=case["recv"])
    rows = case["rows"].clone()
    rows[::9] = -1
    recv_off = torch.tensor(_prefix(case["recv"]), dtype=torch.int32)
    ref = moe_symm.plan_reference(rows, case["ends"], recv_off, rank, ws, experts, bms, expert_major, expert_major)
    got = moe_plan.plan(rows, case["ends"].to(torch.int32), recv_off, rank, ws, experts, bms, expert_major,
                        expert_major)
    valid = int(ref["counts"].sum())
    assert valid > 0
    for key in ("counts", "row_start", "contig"):
        assert got[key].tolist() == ref[key].tolist(), key
    assert got["srows"][:valid].tolist() == ref["srows"][:valid].tolist()
    for bm in bms:
        assert got["tile_start"][bm].tolist() == ref["tile_start"][bm].tolist(), bm
        assert got["src_tiles"][bm].tolist() == ref["src_tiles"][bm].tolist(), bm
        if expert_major:  # the tiles spanning an expert's sources
            assert got["span_start"][bm].tolist() == ref["span_start"][bm].tolist(), bm
            assert got["span_src"][bm].tolist() == ref["span_src"][bm].tolist(), bm
    assert (set(got["span_start"]) == set(bms)) == expert_major
    assert got["expert_major"] == expert_major and got["recv_off"] is recv_off


def test_plan_takes_the_kernel_only_where_it_applies():
    from overlap_backend.codegen import moe_plan

    assert moe_plan.unsupported(1000, 32, (64, 128)) is None
    assert "rows" in moe_plan.unsupported(knobs.codegen.MOE_PLAN_MAX_ROWS + 1, 32, (64,))
    assert "groups" in moe_plan.unsupported(10, moe_plan.MAX_GROUPS + 1, (64,))
    assert "block heights" in moe_plan.unsupported(10, 4, (16, 64, 128))


# ------------------------------------------------------------------------------ GEMM kernels
def _buffers(ws, rank, case, h, dtype, gen):
    """x (this rank's rows), the dispatch buffer with every peer's rows already in its slot, R."""
    send_off, recv_off = _prefix(case["send"]), _prefix(case["recv"])
    x = torch.randn(send_off[-1], h, generator=gen).to(dtype)
    cap = max(1, x.shape[0], max(case["recv"]))
    disp = torch.full((ws * cap, h), float("nan")).to(dtype)
    recv_rows = torch.randn(recv_off[-1], h, generator=gen).to(dtype)
    recv_rows[recv_off[rank] : recv_off[rank + 1]] = x[send_off[rank] : send_off[rank + 1]]
    for s in range(ws):  # the own rows too: the runtime copies them into slot `rank`
        disp[s * cap : s * cap + case["recv"][s]] = recv_rows[recv_off[s] : recv_off[s + 1]]
    return x, disp, cap, recv_rows


@pytest.mark.parametrize("skew,sorted_sources,expert_major", [(False, False, False), (False, True, False),
                                                               (True, True, False), (True, False, True)],
                         ids=["balanced-gather", "balanced-tma", "skewed-tma", "skewed-gather-expert-major"])
@pytest.mark.parametrize("ws,rank,dtype", [(2, 1, torch.float32), (3, 0, torch.bfloat16)])
@pytest.mark.parametrize("tma_store", [False, True], ids=["pointer-stores", "tma-stores"])
def test_gemm_kernels_scatter_and_counters(ws, rank, dtype, skew, sorted_sources, expert_major, tma_store):
    """gate/up then down with the dispatch flags pre-set: own rows land in ``out`` at their send
    position, remote rows in the staging buffer at their received position, rows no grouped row
    points at stay 0; each source's done flag is raised (also for sources without tiles), counters
    are back to 0. With the down kernel's TMA stores (16-bit outputs: full tiles of consecutive rows; the column
    tile past H clipped) the same, its remote tiles counted after the CTA's next main loop."""
    _scatter_and_count(ws, rank, dtype, skew, sorted_sources, expert_major, tma_store)


@pytest.mark.parametrize("skew,sorted_sources", [(False, False), (False, True), (True, True), (True, False)],
                         ids=["balanced-gather", "balanced-sorted", "skewed-sorted", "skewed-gather"])
@pytest.mark.parametrize("ws,rank,dtype", [(2, 1, torch.float32), (3, 0, torch.bfloat16), (4, 2, torch.bfloat16)])
def test_gemm_kernels_span_an_experts_sources(ws, rank, dtype, skew, sorted_sources, monkeypatch):
    """Expert-major row tiles spanning an expert's sources (``knobs.moe.SPAN_SOURCES``; groups of a few rows against
    16-row tiles): the same results, scatter and flags as tiles of one group, in fewer tiles; rows gathered from
    several sources' slots, each source waited for, each row's result sent to its source, each remote source's
    done flag raised once every tile holding its rows is stored."""
    launched = []
    real_launch = moe_gemm.launcher.launch
    gemms = (moe_gemm.gate_up_kernel, moe_gemm.down_kernel)
    monkeypatch.setattr(moe_gemm.launcher, "launch", lambda fn, grid, *a, **kw: (
        fn in gemms and launched.append(kw["SPAN"])) or real_launch(fn, grid, *a, **kw))
    hole = ws >= 3  # the source between rank + 1 and this rank sent nothing: tiles hold rows from both sides of it
    with knobs.moe.patch(SPAN_SOURCES=True):
        pl = _scatter_and_count(ws, rank, dtype, skew, sorted_sources, True, False, hole=hole)
    assert launched == [True, True], "both kernels ran their spanning tiles"
    bm = CFG[0]
    if hole and not skew:  # some tile holds rows of positions 0 and 2 of one expert, none of position 1 (skewed: 0 sent none)
        counts, starts = pl["counts"].view(-1, ws), pl["row_start"].view(-1, ws)
        assert counts[:, 1].sum() == 0
        assert any(c[0] and c[2] and (s[0] + c[0] - 1 - s[0]) // bm == (s[2] - s[0]) // bm
                   for c, s in zip(counts.tolist(), starts.tolist()))
    fewer = pl["span_start"][bm][-1] < pl["tile_start"][bm][-1]
    assert fewer or (skew and pl["span_start"][bm][-1] == pl["tile_start"][bm][-1]), "spanning tiles: fewer of them"


def _scatter_and_count(ws, rank, dtype, skew, sorted_sources, expert_major, tma_store, hole=False):
    """``test_gemm_kernels_scatter_and_counters``' checks on one case (``hole``: source rank + 2 sent nothing);
    returns the plan."""
    gen = torch.Generator().manual_seed(ws + rank + 3 * skew)
    experts, h, f = 3, 24, 40
    recv = [50 + 7 * s for s in range(ws)] if tma_store else None  # groups of more rows than a tile
    case = _case(ws, rank, experts, h, f, gen, skew=skew, empty=(2,), idle=2, sorted_sources=sorted_sources, recv=recv)
    if skew:
        case["recv"][(rank + 1) % ws] = 0  # a source that sent nothing
        case = _case(ws, rank, experts, h, f, gen, skew=True, empty=(2,), send=case["send"], recv=case["recv"],
                     sorted_sources=sorted_sources)
    if hole:
        case["recv"][(rank + 2) % ws] = 0
        case = _case(ws, rank, experts, h, f, gen, skew=skew, empty=(2,), send=case["send"], recv=case["recv"],
                     sorted_sources=sorted_sources)
    wg, wu, wd = _weights(experts, h, f, gen, torch.float16)
    x, disp, cap, recv_rows = _buffers(ws, rank, case, h, dtype, gen)
    send_off, recv_off = _prefix(case["send"]), _prefix(case["recv"])
    recv_off_t = torch.tensor(recv_off, dtype=torch.int32)
    pl = moe_symm.plan(case["rows"], case["ends"], recv_off_t, rank, ws, experts, [CFG[0]], expert_major)
    if sorted_sources:
        assert pl["contig"].all()  # sorted senders: TMA for every group
        if tma_store:  # some full tile is stored by TMA
            assert (pl["counts"] >= CFG[0]).any()
    elif not skew:
        assert not pl["contig"].all()  # some group is gathered
    flags = torch.zeros(64, dtype=torch.int32)
    ARR, CNT, DONE = 0, 24, 32
    flags[ARR : ARR + ws] = EPOCH
    claim, report = torch.zeros(1, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)
    m = len(case["rows"])
    act = torch.full((max(m, 1), f), float("nan")).to(torch.float16)
    caps = torch.full((ws,), cap, dtype=torch.int32)  # every source's x has this rank's row count
    moe_gemm.launch_gate_up(disp, wg, wu, act, pl, flags[ARR:], caps, EPOCH, (claim, report), 10**6, rank, ws, cap, CFG,
                            3, timed=False)
    out = torch.full_like(x, float("nan"))
    out[send_off[rank] : send_off[rank + 1]] = 0
    stage = torch.zeros(max(recv_off[-1], 1), h, dtype=dtype)
    assert moe_gemm.tma_stores(out, stage) == (dtype != torch.float32)  # 32-bit outputs: pointer stores
    moe_gemm.launch_down(act, wd, out, stage, pl, flags[CNT:], flags[DONE:], EPOCH, rank, ws,
                         send_off[rank], CFG[:6] + (tma_store,), 2)
    assert claim.item() == 0 and report[0].item() == 0
    ref = _reference_yr(recv_rows.float(), case["rows"], case["ends"], wg, wu, wd)
    tol = 2e-2
    own = out[send_off[rank] : send_off[rank + 1]].float()
    assert _rel(own, ref[recv_off[rank] : recv_off[rank + 1]]) < tol or own.numel() == 0
    for s in range(ws):
        if s != rank and case["recv"][s]:
            seg = stage[recv_off[s] : recv_off[s + 1]].float()
            assert _rel(seg, ref[recv_off[s] : recv_off[s + 1]]) < tol
    assert torch.isnan(out[: send_off[rank]]).all() and torch.isnan(out[send_off[rank + 1] :]).all()  # untouched
    assert flags[DONE : DONE + ws - 1].tolist() == [EPOCH] * (ws - 1)
    assert flags[CNT : CNT + ws].tolist() == [0] * ws
    return pl


def test_gate_up_times_out_on_missing_dispatch():
    """A dispatch flag below the epoch: the gate/up kernel gives up and leaves a status word that
    names moe_experts, the rank and the source."""
    gen = torch.Generator().manual_seed(1)
    ws, rank, experts, h, f = 2, 0, 2, 16, 16
    case = _case(ws, rank, experts, h, f, gen, recv=[4, 5])
    wg, wu, _ = _weights(experts, h, f, gen, torch.float16)
    x, disp, cap, _ = _buffers(ws, rank, case, h, torch.bfloat16, gen)
    pl = moe_symm.plan(case["rows"], case["ends"], torch.tensor(_prefix(case["recv"]), dtype=torch.int32), rank, ws,
                       experts, [CFG[0]])
    flags = torch.zeros(8, dtype=torch.int32)
    claim, report = torch.zeros(1, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)
    act = torch.empty(len(case["rows"]), f, dtype=torch.float16)
    flags[rank] = EPOCH  # the own rows are there, source 1's are not
    caps = torch.full((ws,), cap, dtype=torch.int32)
    moe_gemm.launch_gate_up(disp, wg, wu, act, pl, flags, caps, EPOCH, (claim, report), 5000, rank, ws, cap, CFG, 1,
                            timed=False)
    words = report.tolist()
    assert words[:6] == [1, 5, rank, 1, 0, EPOCH]
    err = symm.status_error(words, "", 1.0)
    assert "moe_experts on rank 0" in str(err) and "rank 1's dispatched tokens" in str(err)
    assert not isinstance(err, symm.SymmMismatchError)


def test_gate_up_reports_a_peer_with_other_row_counts():
    """A source whose x had another row count (its MOE_CAP word) sized its slots differently: the
    gate/up kernel reports the mismatch (status word 0 = 2, the source, both counts) and finishes;
    not in the tuning runs (epoch 0) nor against a released word (the watchdog's own message)."""
    gen = torch.Generator().manual_seed(2)
    ws, rank, experts, h, f = 3, 1, 2, 16, 16
    case = _case(ws, rank, experts, h, f, gen, recv=[4, 5, 3])
    wg, wu, _ = _weights(experts, h, f, gen, torch.float16)
    x, disp, cap, _ = _buffers(ws, rank, case, h, torch.bfloat16, gen)
    pl = moe_symm.plan(case["rows"], case["ends"], torch.tensor(_prefix(case["recv"]), dtype=torch.int32), rank, ws,
                       experts, [CFG[0]])
    act = torch.empty(len(case["rows"]), f, dtype=torch.float16)

    def run(caps, epoch):
        flags = torch.full((8,), epoch, dtype=torch.int32)  # every source's rows have arrived
        claim, report = torch.zeros(1, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)
        moe_gemm.launch_gate_up(disp, wg, wu, act, pl, flags, torch.tensor(caps, dtype=torch.int32), epoch,
                                (claim, report), 5000, rank, ws, cap, CFG, 1, timed=False)
        return report.tolist()

    odd = (rank + 1) % ws
    caps = [cap] * ws
    caps[odd] = cap + 16
    words = run(caps, EPOCH)
    assert words[:6] == [2, 5, rank, 300 + odd, cap + 16, cap], words
    err = symm.status_error(words, "", 1.0)
    assert isinstance(err, symm.SymmMismatchError) and isinstance(err, symm.SymmTimeoutError)
    assert f"rank {odd} called it with {cap + 16} token rows (x), this rank with {cap}" in str(err), str(err)
    assert run(caps, 0)[0] == 0  # tuning: nothing was communicated
    from overlap_backend.codegen import flags as kernel_flags

    assert kernel_flags.RELEASED_VALUE.value == symm_layout.RELEASED
    caps[odd] = symm_layout.RELEASED
    assert run(caps, EPOCH)[0] == 0
    caps[rank] = cap + 1  # this rank's own word is not read
    caps[odd] = cap
    assert run(caps, EPOCH)[0] == 0


def test_caps_check_reports_a_peer_with_other_row_counts():
    """The grouped_mm form's row-count check (``codegen/moe_caps.py``, no GEMM kernel to do it) reports
    as the gate/up kernel does; a released word and this rank's own word are not reported."""
    from overlap_backend.codegen import moe_caps

    ws, rank, cap = 3, 1, 24

    def run(caps):
        claim, report = torch.zeros(1, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)
        moe_caps.launch(torch.tensor(caps, dtype=torch.int32), (claim, report), rank, ws, cap)
        return report.tolist()

    odd = (rank + 1) % ws
    caps = [cap] * ws
    assert run(caps)[0] == 0
    caps[odd] = cap + 16
    assert run(caps)[:6] == [2, 5, rank, 300 + odd, cap + 16, cap]
    caps[odd] = symm_layout.RELEASED
    assert run(caps)[0] == 0
    caps[odd], caps[rank] = cap, cap + 1
    assert run(caps)[0] == 0


@triton.jit
def _walk_probe(out_ptr, srows_ptr, counts_ptr, row_start_ptr, tile_start_ptr, tiles_n, G, E, group_lo, group_hi,
                start_group, LOG_G: tl.constexpr, BM: tl.constexpr, WS: tl.constexpr, GROUP_M: tl.constexpr):
    """One CTA's walk as ``gate_up_kernel`` makes it: the group of each tile, in order."""
    first_tile, n_tiles, shift = moe_gemm.walk(tile_start_ptr, tiles_n, group_lo, group_hi, start_group)
    for i in range(0, n_tiles):
        tile = first_tile + (i + shift) % n_tiles
        g, e, pos, pid_n, first, offs_p, mask, srow = moe_gemm.tile_rows(tile, tiles_n, tile_start_ptr, row_start_ptr,
                                                                         counts_ptr, srows_ptr, G, E, LOG_G, BM, WS,
                                                                         False, GROUP_M)
        tl.store(out_ptr + i * 3, g)
        tl.store(out_ptr + i * 3 + 1, pid_n)
        tl.store(out_ptr + i * 3 + 2, first)


@pytest.mark.parametrize("ws,rank,lo,hi,start", [(2, 0, 0, 6, 3), (3, 1, 0, 9, 6), (3, 1, 3, 9, 6), (2, 1, 0, 6, 0)],
                         ids=["ws2-own-first", "ws3-own-first", "ws3-phase-own-first", "ws2-source-order"])
def test_walk_starts_at_start_group_and_covers_every_tile_once(ws, rank, lo, hi, start):
    """The gate/up walk from ``start_group`` (the own groups, position ws - 1): their tiles first,
    then groups ``lo ..`` in order, every tile of the launch exactly once."""
    gen = torch.Generator().manual_seed(ws + rank)
    experts, bm, tiles_n = 3, 4, 2
    case = _case(ws, rank, experts, 8, 8, gen, empty=(1,))
    pl = moe_symm.plan(case["rows"], case["ends"], torch.tensor(_prefix(case["recv"]), dtype=torch.int32), rank, ws,
                       experts, [bm])
    ts = pl["tile_start"][bm]
    n = int(ts[hi] - ts[lo]) * tiles_n
    out = torch.full((max(n, 1) * 3,), -1, dtype=torch.int32)
    G = ws * experts
    _walk_probe[(1,)](out, pl["srows"], pl["counts"], pl["row_start"], ts, tiles_n, G, experts, lo, hi, start,
                      LOG_G=moe_gemm.log_groups(G), BM=bm, WS=ws, GROUP_M=2)
    visits = [tuple(v) for v in out[: n * 3].view(-1, 3).tolist()]
    groups = [v[0] for v in visits]
    expect_groups = [g for g in list(range(start, hi)) + list(range(lo, start)) for _ in range(int(ts[g + 1] - ts[g]) * tiles_n)]
    assert groups == expect_groups
    assert len(set(visits)) == len(visits) == n  # every (group, column tile, row tile) once


# ----------------------------------------------------------------------------- comm kernel
@pytest.mark.parametrize("ws,rank", [(2, 0), (4, 1)])
def test_comm_kernel_push_and_pull(ws, rank):
    """With done/READY/returned flags pre-set: each staging segment lands in its source's combine
    slot ``rank`` (in that peer's own buffer), each peer's returned flag is raised, and every
    combine slot of this rank is copied into ``out`` at its send rows; empty segments too."""
    gen = torch.Generator().manual_seed(ws + rank)
    h, cap = 8, 12
    recv = [int(v) for v in torch.randint(0, cap, (ws,), generator=gen)]
    send = [int(v) for v in torch.randint(0, cap, (ws,), generator=gen)]
    recv[(rank + 1) % ws] = 0
    send[rank] = recv[rank]
    recv_off, send_off = _prefix(recv), _prefix(send)
    comb_off = ws * cap * h  # elements: combine region after the dispatch region
    datas = [torch.zeros(2 * ws * cap * h) for _ in range(ws)]
    flag_bufs = [torch.zeros(64, dtype=torch.int32) for _ in range(ws)]
    RET, DONE, PUSHED = 8, 32, 40
    mine = flag_bufs[rank]
    mine[symm_layout.READY : symm_layout.READY + ws] = EPOCH
    mine[RET : RET + ws] = EPOCH
    mine[DONE : DONE + ws] = EPOCH
    stage = torch.randn(max(recv_off[-1], 1), h, generator=gen)
    comb = datas[rank][comb_off:].view(ws * cap, h)
    comb.copy_(torch.randn(ws * cap, h, generator=gen))
    out = torch.full((send_off[-1], h), float("nan"))
    data_tab = torch.tensor([d.data_ptr() for d in datas], dtype=torch.int64)
    flag_tab = torch.tensor([fb.data_ptr() for fb in flag_bufs], dtype=torch.int64)
    claim, report = torch.zeros(1, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)
    moe_comm.launch(stage, comb, out, data_tab, flag_tab, torch.tensor(recv_off, dtype=torch.int32),
                    torch.tensor(send_off, dtype=torch.int32), mine[DONE:], mine[PUSHED:], mine[symm_layout.READY:],
                    mine[RET:], EPOCH, (claim, report), 10**6, rank, ws, cap, comb_off, RET, 3, timed=False, block=16)
    assert claim.item() == 0
    for s in range(ws):
        if s == rank:
            continue
        peer_comb = datas[s][comb_off:].view(ws, cap, h)[rank]
        assert torch.equal(peer_comb[: recv[s]], stage[recv_off[s] : recv_off[s + 1]])
        assert flag_bufs[s][RET + rank].item() == EPOCH
        assert torch.equal(out[send_off[s] : send_off[s + 1]], comb.view(ws, cap, h)[s, : send[s]])
    assert torch.isnan(out[send_off[rank] : send_off[rank + 1]]).all()  # own rows: the down GEMM's
    assert mine[PUSHED : PUSHED + ws].tolist() == [0] * ws


# ------------------------------------------------------------------- the whole Python path
class FakeState:
    """What ``moe_symm`` uses of a GroupState, for rank ``rank`` of ``ws``: CPU buffers per rank,
    peers' deliveries pre-set by the test."""

    timeout_ns, num_sms = 10**6, 5
    push_stream = copy_stream = None

    def __init__(self, ws, rank, nbytes):
        self.ws, self.rank = ws, rank
        self.datas = [torch.zeros(nbytes, dtype=torch.uint8) for _ in range(ws)]
        self.flag_bufs = [torch.zeros(symm_layout.FLAG_WORDS, dtype=torch.int32) for _ in range(ws)]
        self.flags = self.flag_bufs[rank]
        self.report = torch.zeros(8, dtype=torch.int32)
        self.pushes = []

    def ensure_data(self, n, op=""):
        assert n <= self.datas[0].numel()

    def data_view(self, dtype, shape, off=0):
        n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        return self.datas[self.rank][off : off + n].view(dtype).view(shape)

    def flag_arg(self, i):
        return self.flags[i:]

    def status_arg(self):
        return self.flags[symm_layout.CLAIM :], self.report

    def begin(self, compute, what="a symm call", graph=False):
        return 1 if graph else EPOCH  # a captured call's flags toggle to 1 (symm_layout.GRAPH_BLOCK)

    def push_stream_to(self, peer):
        return self.push_stream

    def push(self, peer, dst, src, nbytes, flag, stream=None):
        self.pushes.append((peer, dst, nbytes, flag))

    def end(self, compute):
        pass

    def peer_tables(self):
        return (torch.tensor([d.data_ptr() for d in self.datas], dtype=torch.int64),
                torch.tensor([f.data_ptr() for f in self.flag_bufs], dtype=torch.int64))


@pytest.mark.parametrize("skew,order,schedule,own_first,graph,gemm", [
    (False, "source", "rotated", 0.0, False, "triton"), (True, "source", "rotated", 0.0, False, "triton"),
    (True, "auto", "rotated", 0.0, False, "triton"), (False, "source", "phased", 0.0, False, "triton"),
    (False, "source", "phased", 0.5, False, "triton"), (True, "source", "phased", 0.0, True, "triton"),
    (False, "source", "phased", 0.0, False, "grouped_mm"), (True, "source", "phased", 0.0, False, "grouped_mm"),
    (True, "auto", "rotated", 0.0, False, "grouped_mm"), (True, "source", "phased", 0.0, True, "grouped_mm"),
    (False, "expert", "phased", 0.0, False, "triton-span"), (True, "expert", "rotated", 0.0, True, "triton-span")],
    ids=["balanced", "skewed", "skewed-auto", "phased", "phased-own-first", "captured", "grouped-phased",
         "grouped-skewed-phased", "grouped-one-segment", "grouped-captured", "expert-span", "expert-span-captured"])
@pytest.mark.parametrize("ws,rank", [(2, 1), (3, 0)])
@knobs.codegen.patch(MOE_GATE_UP_16BIT=(CFG,), MOE_DOWN_16BIT=(CFG,))
def test_symm_path_with_fake_group(monkeypatch, ws, rank, skew, order, schedule, own_first, graph, gemm):
    """``moe_symm.moe_experts`` end to end on one fake rank: dispatch pushes (to rank-1 first, into
    slot ``rank``), the kernels, the peer stores of the results, and ``out`` == the op's semantics
    (own rows computed here, peers' rows as they 'returned' them). ``auto`` takes the expert-major
    tile order at these sizes. ``captured``: the call as a CUDA-graph capture makes it (after an
    eager call of the same splits and sizes): every flag in the toggling block (symm_layout.GRAPH_BLOCK,
    raised to 1), none of the eager block touched; without that eager call it runs on p2p. ``grouped_mm``:
    the experts by CPU's ``torch._grouped_mm`` (bf16 experts; the outputs not zeroed first: it writes every
    row), the rest of the protocol alike. ``triton-span``: the kernels' row tiles spanning an expert's sources
    (``knobs.moe.SPAN_SOURCES``)."""
    gen = torch.Generator().manual_seed(ws * 3 + rank + skew)
    experts, h, f = 2, 16, 32
    n_send = 18
    send = [n_send // ws] * ws
    send[-1] += n_send - sum(send)
    recv = [int(v) for v in torch.randint(0, n_send + 1, (ws,), generator=gen)]
    recv[rank] = send[rank]
    if skew:
        recv[(rank + 1) % ws] = 0  # a source that sent nothing
    case = _case(ws, rank, experts, h, f, gen, skew=skew, empty=(1,) if skew else (), send=send, recv=recv,
                 sorted_sources=not skew)
    dtype = torch.bfloat16
    span = gemm == "triton-span"
    gemm = "triton" if span else gemm
    wg, wu, wd = _weights(experts, h, f, gen, torch.float16 if gemm == "triton" else torch.bfloat16)
    x = torch.randn(n_send, h, generator=gen).to(dtype)
    lay = moe_symm.layout(ws, n_send, h, 2)
    st = FakeState(ws, rank, lay["bytes"])
    send_off, recv_off = _prefix(case["send"]), _prefix(case["recv"])
    recv_rows = torch.randn(recv_off[-1], h, generator=gen).to(dtype)
    recv_rows[recv_off[rank] : recv_off[rank + 1]] = x[send_off[rank] : send_off[rank + 1]]
    disp = st.data_view(dtype, (ws, n_send, h), lay["disp"])
    comb = st.data_view(dtype, (ws, n_send, h), lay["comb"])
    returned = torch.randn(ws, n_send, h, generator=gen).to(dtype)
    for s in range(ws):
        if s != rank:
            disp[s, : case["recv"][s]] = recv_rows[recv_off[s] : recv_off[s + 1]]
            comb[s] = returned[s]
    base, value = (symm_layout.GRAPH_BLOCK, 1) if graph else (0, EPOCH)
    for w in (symm_layout.MOE_ARRIVED, symm_layout.MOE_RETURNED, symm_layout.READY):
        st.flags[base + w : base + w + ws] = value
    st.flags[symm_layout.MOE_CAP : symm_layout.MOE_CAP + ws] = n_send  # the peers' row counts of x (the CUDA path writes them)
    from overlap_backend.runtime.symm import lowering_helpers, registry

    monkeypatch.setattr(registry, "state", lambda *a: st)
    if graph:
        monkeypatch.setattr(moe_symm, "capturing", lambda t: True)
        monkeypatch.setattr(moe_symm, "capture_problem", lambda t: None)
        monkeypatch.setattr(moe_symm, "call_state", lambda *a: (st, None))
        st.data = type("D", (), {"nbytes": lay["bytes"]})()
        monkeypatch.setattr(moe_symm, "_metas", {})
        monkeypatch.setattr(lowering_helpers, "tuned_configs", {})
        monkeypatch.setattr(moe_symm, "tuned_configs", lowering_helpers.tuned_configs)
        fell_back = []
        monkeypatch.setattr(moe_symm, "run_on_p2p", lambda op, why, *a: fell_back.append(why) or ("p2p", None))
    monkeypatch.setattr(moe_symm, "problem", lambda *a: None)
    # TRANSPORT "sm": the copy-engine transport needs CUDA streams; OWN_FIRST 0.5 of 2 experts: own
    # expert 0 before the remote rows
    with knobs.moe.patch(ENABLED=True, SCHEDULE=schedule, COMM_SMS=2, TRANSPORT="sm", ORDER=order,
                         OWN_FIRST=own_first, EXPERT_GEMM=gemm, SPAN_SOURCES=span):
        _symm_path_calls(x, case, wg, wu, wd, st, lay, ws, rank, skew, graph, recv_rows, returned,
                         fell_back if graph else None, n_send, experts, h, f, dtype)


def _symm_path_calls(x, case, wg, wu, wd, st, lay, ws, rank, skew, graph, recv_rows, returned, fell_back, n_send,
                     experts, h, f, dtype):
    """The calls and checks of ``test_symm_path_with_fake_group``, under its knobs."""
    from overlap_backend.runtime.symm import lowering_helpers

    send_off, recv_off = _prefix(case["send"]), _prefix(case["recv"])
    base, value = (symm_layout.GRAPH_BLOCK, 1) if graph else (0, EPOCH)
    ends = None if skew else case["ends"].to(torch.int32)
    call = lambda: moe_symm.moe_experts(x, case["send"], case["recv"], case["rows"], ends,  # noqa: E731
                                        [] if ends is not None else case["sizes"], wg, wu, wd, "g", [False] * 5)
    grouped = knobs.moe.EXPERT_GEMM == "grouped_mm"
    before = dict(lowering_helpers.PATHS)
    if graph and not grouped:  # nothing an eager call set up: p2p, with the reason
        assert call() == ("p2p", None) and "tuned" in fell_back[0]
    if graph:  # (the grouped_mm form tunes nothing)
        m = case["rows"].shape[0]
        key = (1 << max(0, m - 1).bit_length(), h, f, experts, ws, str(dtype), str(torch.float16), st.num_sms - 2)
        lowering_helpers.tuned_configs.update({("moe_gate_up", key): CFG, ("moe_down", key): CFG})
        assert call() == ("p2p", None) and "splits" in fell_back[-1]
        ends_host = [] if ends is not None else _prefix(case["sizes"])[1:]
        moe_symm._meta(_prefix(case["send"]) + _prefix(case["recv"]) + ends_host, x.device, False)
    out, saved = call()
    assert st.report[0].item() == 0
    went = lowering_helpers.PATHS["moe_experts:symm:grouped_mm"] - before.get("moe_experts:symm:grouped_mm", 0)
    assert went == int(grouped)
    ref = _reference_yr(recv_rows.float(), case["rows"], case["ends"], wg, wu, wd)
    assert _rel(out[send_off[rank] : send_off[rank + 1]].float(), ref[recv_off[rank] : recv_off[rank + 1]]) < 2e-2 \
        or case["recv"][rank] == 0
    for d in range(ws):
        if d == rank:
            continue
        assert torch.equal(out[send_off[d] : send_off[d + 1]], returned[d, : case["send"][d]])
        peer_comb = st.datas[d][lay["comb"] : lay["bytes"]].view(dtype).view(ws, n_send, h)[rank]
        if case["recv"][d]:
            assert _rel(peer_comb[: case["recv"][d]].float(), ref[recv_off[d] : recv_off[d + 1]]) < 2e-2
        assert st.flag_bufs[d][base + symm_layout.MOE_RETURNED + rank].item() == value
    # dispatch: rank-1 first, each into the peer's slot `rank`, with the arrival flag of `rank`
    assert [p[0] for p in st.pushes] == [(rank - j) % ws for j in range(1, ws)]
    assert all(p[1] == lay["disp"] + rank * lay["slot"] and p[3] == symm_layout.MOE_ARRIVED + rank for p in st.pushes)
    # (push takes the word within the call's block: GroupState.push adds the block's base)
    assert [p[2] for p in st.pushes] == [case["send"][(rank - j) % ws] * h * 2 for j in range(1, ws)]
    assert len(saved) == 5 and all(v.numel() == 0 for v in saved)
    lo, hi = symm_layout.MOE_COUNTERS, symm_layout.MOE_PUSHED + symm_layout.WS_MAX
    assert st.flags[base + lo : base + hi].tolist() == [0] * (hi - lo)  # tile and CTA counters back to 0
    own_done = st.flags[base + symm_layout.MOE_DONE : base + symm_layout.MOE_DONE + ws - 1].tolist()
    assert own_done == [value] * (ws - 1)  # the producer finished every remote source
    if graph:  # the eager block untouched (and the other ranks' eager words; MOE_CAP serves both)
        for fb in st.flag_bufs:
            eager = fb[: symm_layout.GRAPH_BLOCK].clone()
            eager[symm_layout.MOE_CAP : symm_layout.MOE_CAP + ws] = 0
            assert not eager.any()


def test_fallback_reasons():
    """What the kernels do not cover is named (and depends only on shapes, dtypes and args)."""
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    w = torch.randn(2, 16, 32, dtype=torch.bfloat16)
    wd = torch.randn(2, 32, 16, dtype=torch.bfloat16)
    rows = torch.arange(4)
    assert "CUDA" in moe_symm.problem(x, w, w, wd, rows, [False] * 5)
    cuda_like = type("T", (), {"device": torch.device("cuda"), "dtype": torch.bfloat16, "dim": lambda s: 2,
                               "shape": (4, 16)})()
    assert "backward" in moe_symm.problem(cuda_like, w, w, wd, rows, [True] + [False] * 4)
    assert "float32" in moe_symm.problem(cuda_like, w.float(), w.float(), wd.float(), rows, [False] * 5)
    odd = type("T", (), {"device": torch.device("cuda"), "dtype": torch.bfloat16, "dim": lambda s: 2,
                         "shape": (4, 12)})()
    assert "16 bytes" in moe_symm.problem(odd, w[:, :12], w[:, :12], wd[:, :, :12], rows, [False] * 5)


def test_comm_kernel_ships_nothing_after_a_timeout():
    """A claimed status word (some wait of this rank gave up): no peer store, no peer flag, and the
    pull side stops waiting at once (no second report)."""
    ws, rank, h, cap = 2, 0, 8, 4
    comb_off = ws * cap * h
    datas = [torch.zeros(2 * ws * cap * h) for _ in range(ws)]
    flag_bufs = [torch.zeros(64, dtype=torch.int32) for _ in range(ws)]
    RET, DONE, PUSHED = 8, 32, 40
    mine = flag_bufs[rank]
    mine[DONE] = EPOCH
    mine[symm_layout.READY + 1] = EPOCH
    stage = torch.ones(3, h)
    out = torch.full((4, h), float("nan"))
    claim, report = torch.ones(1, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)
    moe_comm.launch(stage, datas[rank][comb_off:].view(ws * cap, h), out,
                    torch.tensor([d.data_ptr() for d in datas], dtype=torch.int64),
                    torch.tensor([f.data_ptr() for f in flag_bufs], dtype=torch.int64),
                    torch.tensor([0, 1, 4], dtype=torch.int32),
                    torch.tensor([0, 2, 4], dtype=torch.int32), mine[DONE:], mine[PUSHED:], mine[symm_layout.READY:],
                    mine[RET:], EPOCH, (claim, report), 10**6, rank, ws, cap, comb_off, RET, 2, timed=False, block=16)
    assert flag_bufs[1][RET + rank].item() == 0 and not datas[1].any()
    assert report[0].item() == 0 and mine[PUSHED].item() == 0


def test_phases_cover_every_group_once():
    """Remote-first phases, with and without a share of the own experts first: every group exactly
    once, remote positions in order, own rows split around them."""
    for ws, experts, own_first in ((2, 16, 0.25), (4, 4, 0.5), (3, 2, 0.0), (2, 1, 0.9), (1, 4, 0.5)):
        ph = moe_gemm.phases(ws, experts, False, own_first)
        groups = [g for lo, hi, _, _ in ph for g in range(lo, hi)]
        assert sorted(groups) == list(range(ws * experts)), (ws, experts, own_first, ph)
        remote = [p for _, _, p, _ in ph if p < ws - 1]
        assert remote == list(range(ws - 1))
        if own_first and ws > 1 and experts > 1:
            assert ph[0][2] == ws - 1 and ph[-1][2] == ws - 1  # own share first, the rest last
    assert moe_gemm.phases(4, 4, True, 0.5) == [(0, 16, 0, 4)]  # expert-major: one launch


def _fused_views(wg, wu, wd, layout):
    """The weights as views of one fused gate/up weight: ``"rows"`` ``[E, H, 2F]`` (up half first),
    ``"linear"`` ``[E, 2F, H]`` read as ``F.linear`` does (gate first; ``w_down`` stored ``[E, H, F]``)."""
    f = wg.shape[2]
    if layout == "rows":
        fused = torch.cat([wu, wg], -1)
        return fused[..., f:], fused[..., :f], wd
    fused = torch.cat([wg, wu], -1).transpose(1, 2).contiguous().transpose(1, 2)  # K-major [E, H, 2F] view
    return fused[..., :f], fused[..., f:], wd.transpose(1, 2).contiguous().transpose(1, 2)


@pytest.mark.parametrize("layout", ["rows", "linear"])
def test_gemm_kernels_read_fused_weight_views_in_place(layout):
    """gate/up and down on strided views of a fused gate/up weight (both layouts, K-major down for
    ``linear``): no copy (``kernel_expert_weight`` keeps the view), the results of the contiguous weights."""
    ws, rank, experts, h, f = 2, 1, 3, 24, 40
    gen = torch.Generator().manual_seed(11)
    case = _case(ws, rank, experts, h, f, gen, sorted_sources=True)
    wg, wu, wd = _weights(experts, h, f, gen, torch.float16)
    views = _fused_views(wg, wu, wd, layout)
    assert all(not v.is_contiguous() for v in views[:2])
    kernel_views = [moe_symm.kernel_expert_weight(v) for v in views]
    assert all(k is v for k, v in zip(kernel_views, views)), "a fused weight view was copied"
    x, disp, cap, recv_rows = _buffers(ws, rank, case, h, torch.float32, gen)
    send_off, recv_off = _prefix(case["send"]), _prefix(case["recv"])
    pl = moe_symm.plan(case["rows"], case["ends"], torch.tensor(recv_off, dtype=torch.int32), rank, ws, experts,
                       [CFG[0]])
    flags = torch.zeros(64, dtype=torch.int32)
    ARR, CNT, DONE = 0, 24, 32
    flags[ARR : ARR + ws] = EPOCH
    claim, report = torch.zeros(1, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)
    act = torch.full((max(len(case["rows"]), 1), f), float("nan")).to(torch.float16)
    caps = torch.full((ws,), cap, dtype=torch.int32)
    moe_gemm.launch_gate_up(disp, views[0], views[1], act, pl, flags[ARR:], caps, EPOCH, (claim, report), 10**6, rank,
                            ws, cap, CFG, 3, timed=False)
    out = torch.zeros_like(x)
    stage = torch.zeros(max(recv_off[-1], 1), h)
    moe_gemm.launch_down(act, views[2], out, stage, pl, flags[CNT:], flags[DONE:], EPOCH, rank, ws, send_off[rank],
                         CFG, 2)
    assert claim.item() == 0 and report[0].item() == 0
    ref = _reference_yr(recv_rows.float(), case["rows"], case["ends"], wg, wu, wd)
    assert _rel(out[send_off[rank] : send_off[rank + 1]], ref[recv_off[rank] : recv_off[rank + 1]]) < 2e-2
    other = 1 - rank
    assert _rel(stage[recv_off[other] : recv_off[other + 1]], ref[recv_off[other] : recv_off[other + 1]]) < 2e-2
