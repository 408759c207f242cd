"""CTA-pipelining kernels (codegen/cta.py) under ``TRITON_INTERPRET=1``: a whole group in one process.

The interpreter runs kernels one after another, so the ranks run in stage order: every stage-0
rank's kernel (its tiles land in the stage-1 ranks' "data buffers", plain CPU tensors addressed
through the same peer-pointer tables as on GPU, and its last tile per chunk raises the stage-1
ranks' flags), then every stage-1 rank's kernel (it waits on exactly those flags: a chunk that was
not raised would make it give up), then the collect kernels. Checked against float32 references on
random data with NaN-poisoned outputs and buffers: the activation epilogues, K in arrival order
across producers, rows and columns that do not fill a tile, flags raised to the epoch and counters
back at 0, and the bounded wait's report.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch
import torch.nn.functional as F

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("interpreter tests: they run where CUDA is absent (CI); tests/gpu/test_gpu.py runs the real kernels",
                allow_module_level=True)
triton = pytest.importorskip("triton")
from overlap_backend.codegen import cta  # noqa: E402
from overlap_backend.codegen.flags import OP_CTA_STAGE1  # noqa: E402
from overlap_backend.runtime.cta_plan import k_chunks  # noqa: E402
from overlap_backend.runtime.symm import SymmTimeoutError, status_error  # noqa: E402
from overlap_backend.spec import knobs  # noqa: E402
from overlap_backend.runtime import cuda as _cuda  # noqa: E402
from overlap_backend.spec import symm_layout  # noqa: E402

EPOCH = 7
B = symm_layout.cta_block(False)  # the eager block of the cta_pipeline_mlp flag words
CFG0 = (16, 32, 16, 2, 1, 1)  # BM, BN, BK, GROUP_M, stages, warps
CFG1 = (16, 16, 16, 2, 1, 1)
ANY_ROWS = (1, 1 << 30)  # knobs.cta.STAGE*_FIXUP_CALL_ROWS of a test that asks for the fix-up kernel at its rows
# knobs of a split stage 0's sums: the slots read two at a time, or added by the kernel after the runs, 8 rows a
# program, or one at a time by the last run of each tile
PAIRS = {"SPLIT_SUM_PAIRS": True, "STAGE0_SPLIT_FIXUP": False}
FIXUP0 = {"STAGE0_SPLIT_FIXUP": True, "STAGE0_FIXUP_ROWS": 8, "STAGE0_FIXUP_CALL_ROWS": ANY_ROWS}
IN_KERNEL0 = {"STAGE0_SPLIT_FIXUP": False}
STREAM0 = {**FIXUP0, "STAGE0_STREAM_K": True}  # the fix-up's runs as the programs' equal shares of every K-step


@pytest.fixture(autouse=True)
def _cpu_allocator():
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8))


def _reference(x, w1, b1, w3, b3, w2, b2, act):
    h = x @ w1 + (b1 if b1 is not None else 0)
    if act == "swiglu":
        a = F.silu(h) * (x @ w3 + (b3 if b3 is not None else 0))
    else:
        a = F.gelu(h, approximate="tanh" if act == "gelu_tanh" else "none")
    return a, a @ w2 + (b2 if b2 is not None else 0)


class World:
    """``ws`` ranks' data and flag buffers (CPU tensors) and the peer tables that address them."""

    def __init__(self, ws, M, N, a_numel):
        self.ws, self.tp = ws, ws // 2
        self.y_offset = a_numel * 4
        self.data = [torch.full((a_numel + M * N,), float("nan")) for _ in range(ws)]
        self.flags = [torch.zeros(symm_layout.FLAG_WORDS, dtype=torch.int32) for _ in range(ws)]
        self.peer_data = torch.tensor([d.data_ptr() for d in self.data], dtype=torch.int64)
        self.peer_flags = torch.tensor([f.data_ptr() for f in self.flags], dtype=torch.int64)
        self.M, self.N, self.a_numel = M, N, a_numel

    def a(self, r, kchunk):
        return self.data[r][: self.a_numel].view(-1, kchunk)

    def y(self, r):
        return self.data[r][self.a_numel:].view(self.M, self.N)

    def flag(self, r, word):
        return self.flags[r][B + word:]

    def epoch(self, r):
        self.flags[r][B + symm_layout.CTA_EPOCH] = EPOCH
        return self.flag(r, symm_layout.CTA_EPOCH)


def chunk_major(a, tp, nch, kchunk, mp, f1=0):
    """[M, F] -> [(tp * nch + nch1) * mp, kchunk] as a stage-1 rank keeps it: the stage-0 ranks'
    chunks of the first F - f1 columns, then its own chunks of the last f1 (NaN where nothing is stored)."""
    M, F_ = a.shape
    fp = (F_ - f1) // tp
    nch1 = -(-f1 // kchunk)
    out = torch.full((tp * nch + nch1, mp, kchunk), float("nan"))
    spans = [(p * nch + j, p * fp + j * kchunk, min(p * fp + (j + 1) * kchunk, (p + 1) * fp))
             for p in range(tp) for j in range(nch)]
    spans += [(tp * nch + j, F_ - f1 + j * kchunk, min(F_ - f1 + (j + 1) * kchunk, F_)) for j in range(nch1)]
    for block, lo, hi in spans:
        out[block, :M, : hi - lo] = a[:, lo:hi]
    return out.view(-1, kchunk)


def _run(ws, M, H, F_, N, act, bias, kchunks=2, status=None, skip_producer=None, transport="peer", f1=0,
         ready=False, stage0_order=None, split_k=1, num_sms=3):
    tp = ws // 2
    x = torch.randn(M, H)
    w1, w3 = torch.randn(H, F_) / H**0.5, torch.randn(H, F_) / H**0.5
    w2 = torch.randn(F_, N) / F_**0.5
    b1, b3, b2 = (torch.randn(F_), torch.randn(F_), torch.randn(N)) if bias else (None, None, None)
    if act != "swiglu":
        w3 = b3 = None
    a_ref, y_ref = _reference(x, w1, b1, w3, b3, w2, b2, act)
    fp, ns = (F_ - f1) // tp, N // tp
    bm, group_m = CFG0[0], CFG0[3]
    tiles_m = -(-M // bm)
    mp = tiles_m * bm
    groups = -(-tiles_m // group_m)
    kchunk, nch = _k_chunks(fp, kchunks)
    nch1 = -(-f1 // kchunk)
    world = World(ws, M, N, (tp * nch + nch1) * mp * kchunk)
    if ready:  # as if every rank's begin_kernel had run: READY of every rank raised in every peer's flags
        for r in range(ws):
            world.flags[r][B + symm_layout.CTA_READY:B + symm_layout.CTA_READY + ws] = EPOCH
    code = cta.ACTIVATIONS[{"gelu": ("gelu", "none"), "gelu_tanh": ("gelu", "tanh"), "swiglu": ("swiglu", "none")}[act]]
    for p in range(tp):
        if p == skip_producer:
            continue
        cols = slice(p * fp, (p + 1) * fp)
        stage = torch.full((nch * mp * kchunk,), float("nan")) if transport == "ce" else None
        cta.launch_stage0(x, w1[:, cols].contiguous(), b1[cols].contiguous() if b1 is not None else None,
                          w3[:, cols].contiguous() if w3 is not None else None,
                          b3[cols].contiguous() if b3 is not None else None, stage,
                          world.peer_data, world.peer_flags, world.flag(p, symm_layout.CTA_COUNTERS),
                          world.flag(p, symm_layout.CTA_DONE), world.epoch(p), p, kchunk, nch, B + symm_layout.CTA_ARRIVED, tp, tp,
                          code, CFG0, num_sms, timed=False,
                          ready=world.flag(p, symm_layout.CTA_READY) if ready else None,
                          status=(torch.zeros(1, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)),
                          timeout_ns=10**6, rank=p, **(stage0_order or {}))
        if stage is not None:  # what the host's copy engine does, block by block, once its flag is up
            blocks = stage.view(nch, mp, kchunk)
            for g in range(groups):
                r0, r1 = g * group_m * bm, min(M, (g + 1) * group_m * bm)
                for j in range(nch):
                    assert world.flags[p][B + symm_layout.CTA_DONE + g * nch + j] == EPOCH, (p, g, j)
                    for q in range(tp):
                        world.a(tp + q, kchunk).view(-1, mp, kchunk)[p * nch + j, r0:r1] = blocks[j, r0:r1]
                        world.flags[tp + q][B + symm_layout.CTA_ARRIVED + (g * tp + p) * nch + j] = EPOCH
    outs = [torch.full((M, N), float("nan")) for _ in range(ws)]
    split_counters = [torch.zeros(64, dtype=torch.int32) for _ in range(ws)]
    split = dict(split_k=split_k, split_partials=torch.full((cta.split_partials_numel(M, ns, CFG1, split_k),), float("nan")),
                 split_counters=split_counters[0]) if split_k > 1 else {}
    statuses = [status or (torch.zeros(1, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)) for _ in range(ws)]
    for t in range(tp):
        r = tp + t
        if f1:  # the stage-1 rank's own share of the first GEMM, into its own chunks
            own = slice(F_ - f1, F_)
            cta.launch_stage0(x, w1[:, own].contiguous(), b1[own].contiguous() if b1 is not None else None,
                              w3[:, own].contiguous() if w3 is not None else None,
                              b3[own].contiguous() if b3 is not None else None,
                              world.a(r, kchunk)[tp * nch * mp:].reshape(-1), world.peer_data, world.peer_flags,
                              world.flag(r, symm_layout.CTA_COUNTERS), world.flag(r, symm_layout.CTA_DONE), world.epoch(r), 0, kchunk,
                              nch1, B + symm_layout.CTA_ARRIVED, tp, tp, code, CFG0, 3, timed=False)
        cols = slice(t * ns, (t + 1) * ns)
        cta.launch_stage1(world.a(r, kchunk), w2[:, cols].contiguous(),
                          b2[cols].float().contiguous() if b2 is not None else None, outs[r], world.peer_data,
                          world.peer_flags, world.y_offset, world.flag(r, symm_layout.CTA_ARRIVED),
                          world.flag(r, symm_layout.CTA_Y_COUNTERS), world.epoch(r), statuses[r], 10**6, r, ws, M, fp, t, kchunk,
                          nch, B + symm_layout.CTA_Y_DONE, tp, CFG1, 3, timed=False, f1=f1,
                          ready=world.flag(r, symm_layout.CTA_READY) if ready else None,
                          **(dict(split, split_counters=split_counters[r]) if split else {}))
    for r in range(ws):
        if r < tp or tp > 1:
            cta.launch_collect(world.y(r), outs[r], world.flag(r, symm_layout.CTA_Y_DONE), world.epoch(r), statuses[r], 10**6, r, tp,
                               r - tp if r >= tp else -1, bm, timed=False, col_blocks=2)
    return dict(world=world, outs=outs, a_ref=chunk_major(a_ref, tp, nch, kchunk, mp, f1), y_ref=y_ref,
                statuses=statuses, tiles_m=tiles_m, groups=groups, nch=nch, kchunk=kchunk, split_counters=split_counters)


def _k_chunks(fp, want):
    with knobs.cta.patch(K_CHUNKS=want):
        return k_chunks(fp, CFG0[1], CFG1[2], 2, 1)


@pytest.mark.parametrize("transport", ["peer", "ce"])
@pytest.mark.parametrize("ws,M,H,F_,N,act,bias,f1", [
    (2, 40, 32, 128, 48, "gelu", True, 0),        # M, N not multiples of the tiles; 2 K-chunks
    (2, 16, 16, 96, 32, "gelu_tanh", False, 0),   # a last chunk of one stage-0 tile
    (2, 33, 32, 64, 16, "swiglu", True, 0),       # two accumulators in stage 0
    (2, 33, 32, 160, 16, "swiglu", True, 32),     # stage 1 computes the last 32 columns of A itself
    (4, 24, 16, 128, 64, "swiglu", False, 0),     # 2 stages x TP2: K from two producers, N from two consumers
    (4, 24, 16, 192, 64, "swiglu", False, 64),    # ... and a stage-1 share (both stage-1 ranks compute it)
    (4, 20, 32, 256, 32, "gelu", True, 0),
])
def test_pipeline_matches_mlp(ws, M, H, F_, N, act, bias, f1, transport):
    res = _run(ws, M, H, F_, N, act, bias, transport=transport, f1=f1)
    world, tp = res["world"], ws // 2
    for r in range(tp, ws):  # every stage-1 rank received the whole activation, chunk-major
        torch.testing.assert_close(world.a(r, res["kchunk"]), res["a_ref"], atol=1e-4, rtol=1e-4, equal_nan=True)
    for r in range(ws):
        assert res["statuses"][r][1].tolist() == [0] * 8, f"rank {r} gave up a wait"
        torch.testing.assert_close(res["outs"][r], res["y_ref"], atol=1e-4, rtol=1e-4)
    # Flags: each stage-1 rank got every (row block, producer, chunk) flag, each rank every other
    # consumer's row-block flags; every counter is back at 0 for the next call.
    n_chunk = res["groups"] * tp * res["nch"]
    for r in range(tp, ws):
        assert world.flags[r][B + symm_layout.CTA_ARRIVED:B + symm_layout.CTA_ARRIVED + n_chunk].eq(EPOCH).all()
    for r in range(ws):
        for t in range(tp):
            if r != tp + t:
                block = world.flags[r][B + symm_layout.CTA_Y_DONE + t * res["tiles_m"]:][: res["tiles_m"]]
                assert block.eq(EPOCH).all(), (r, t, block)
        assert world.flags[r][B + symm_layout.CTA_COUNTERS:B + symm_layout.CTA_DONE].eq(0).all()
        assert world.flags[r][B + symm_layout.CTA_Y_COUNTERS:B + symm_layout.CTA_EPOCH].eq(0).all()


@pytest.mark.parametrize("ws,M,H,F_,N,act,bias,f1,split_k", [
    (2, 40, 32, 128, 48, "gelu", True, 0, 2),       # 2 K-chunks, each its own split
    (2, 40, 32, 192, 48, "gelu", True, 0, 2),       # 3 K-chunks in 2 runs: 1 + 2
    (4, 24, 16, 192, 64, "swiglu", False, 64, 3),   # own chunks first, then two producers' in arrival order
    (4, 20, 32, 256, 32, "gelu", True, 0, 16),      # more splits than K-chunks: one run per chunk
])
@pytest.mark.parametrize("fixup", [False, True], ids=["in_kernel", "fixup_kernel"])
def test_stage1_split_k_matches_mlp(ws, M, H, F_, N, act, bias, f1, split_k, fixup):
    """Stage 1 with each tile's K-chunks in several runs (``SPLIT_K``; slots NaN-poisoned): the MLP's
    result on every rank, every row-block flag raised, the split counters back at 0; the runs' sums added by the last
    run of each tile or by the kernel after them, 8 rows a program (``knobs.cta.STAGE1_SPLIT_FIXUP``, at any rows)."""
    with knobs.cta.patch(STAGE1_SPLIT_FIXUP=fixup, STAGE1_FIXUP_ROWS=8, STAGE1_FIXUP_CALL_ROWS=ANY_ROWS):
        res = _run(ws, M, H, F_, N, act, bias, f1=f1, split_k=split_k)
    world, tp = res["world"], ws // 2
    for r in range(ws):
        assert res["statuses"][r][1].tolist() == [0] * 8, f"rank {r} gave up a wait"
        torch.testing.assert_close(res["outs"][r], res["y_ref"], atol=1e-4, rtol=1e-4)
        assert res["split_counters"][r].eq(0).all(), (r, res["split_counters"][r])
        assert world.flags[r][B + symm_layout.CTA_Y_COUNTERS:B + symm_layout.CTA_EPOCH].eq(0).all()
        for t in range(tp):
            if r != tp + t:
                assert world.flags[r][B + symm_layout.CTA_Y_DONE + t * res["tiles_m"]:][: res["tiles_m"]].eq(EPOCH).all()


@pytest.mark.parametrize("stage", [0, 1])
def test_split_sums_after_the_runs_only_at_the_rows_it_was_measured_faster(stage):
    """The fix-up kernel sums a split stage at the calls of one 128-row block (``STAGE*_FIXUP_CALL_ROWS``, both ends
    in), never an unsplit one, never with ``STAGE*_SPLIT_FIXUP`` off."""
    sums_after_runs = (cta.stage0_sums_after_runs, cta.stage1_sums_after_runs)[stage]
    lo, hi = getattr(knobs.cta, f"STAGE{stage}_FIXUP_CALL_ROWS")
    assert [sums_after_runs(m, 4) for m in (lo - 1, lo, hi, hi + 1)] == [False, True, True, False]
    assert not sums_after_runs(hi, 1)
    with knobs.cta.patch(**{f"STAGE{stage}_SPLIT_FIXUP": False}):
        assert not sums_after_runs(hi, 4)


@pytest.mark.parametrize("ws,M,H,F_,N,act,bias,transport,tma,first,split,sums", [
    (2, 40, 64, 128, 48, "gelu", True, "ce", True, False, 4, IN_KERNEL0),  # 4 K-steps in 4 runs, TMA stores
    (2, 40, 64, 128, 48, "gelu", True, "ce", True, False, 4, PAIRS),     # the same, the slots read two at a time
    (2, 33, 48, 64, 16, "swiglu", True, "peer", False, True, 3, IN_KERNEL0),  # two accumulators, 3 runs (a pair and one)
    (4, 24, 64, 128, 64, "swiglu", False, "ce", False, True, 2, IN_KERNEL0),  # 2 producers, each splitting
    (4, 20, 64, 256, 32, "gelu", True, "peer", False, False, 3, PAIRS),  # a pair of slots, then one
    (2, 40, 64, 128, 48, "gelu", True, "ce", True, False, 4, FIXUP0),    # summed after the runs, into the staging
    (2, 33, 48, 64, 16, "swiglu", True, "peer", False, True, 3, FIXUP0),  # ... two accumulators, into the peers
    (4, 20, 64, 256, 32, "gelu", True, "peer", False, False, 3, FIXUP0),  # ... 2 producers
], ids=lambda v: ("pairs" if v == PAIRS else "fixup" if v == FIXUP0 else "slots") if isinstance(v, dict) else None)
def test_stage0_split_k_matches_mlp(ws, M, H, F_, N, act, bias, transport, tma, first, split, sums):
    """Stage 0 with each tile's K-steps in several runs (``SPLIT_K``; slots NaN-poisoned), the run
    that adds the last pair making the tile's epilogue: the same chunk-major blocks, flags and MLP
    result, every counter (chunk and split) back at 0; the slots read one at a time or two (GELU's one accumulator;
    ``knobs.cta.SPLIT_SUM_PAIRS``), or added by the kernel after the runs, a few rows a program
    (``STAGE0_SPLIT_FIXUP``)."""
    tp = ws // 2
    fp = F_ // tp
    tiles = -(-M // CFG0[0]) * -(-fp // CFG0[1])
    counters = torch.zeros(tiles, dtype=torch.int32)
    accumulators = 2 if act == "swiglu" else 1
    parts = torch.full((cta.split_partials_numel(M, fp, CFG0, split, accumulators),), float("nan"))
    with knobs.cta.patch(**sums):
        res = _run(ws, M, H, F_, N, act, bias, transport=transport,
                   stage0_order=dict(tma_store=tma, count_first_at_once=first, split_k=split, split_partials=parts,
                                     split_counters=counters))
    _check_staged_blocks_and_result(res, ws)
    assert counters.eq(0).all() and not parts.isnan().all()  # (every producer used the same buffers, in turn)


@pytest.mark.parametrize("ws,M,H,F_,act,num_sms", [
    (2, 40, 64, 128, "gelu", 5),     # 12 tiles of 4 K-steps over 5 programs: 9 or 10 steps each, across tiles
    (2, 40, 80, 128, "gelu", 7),     # 5 K-steps a tile, 60 over 7 programs
    (2, 33, 48, 64, "swiglu", 4),    # two accumulators
    (4, 20, 64, 256, "gelu", 11),    # 2 producers, 32 steps over 11 programs
    (2, 16, 32, 64, "gelu", 64),     # more programs than K-steps: some programs do nothing
])
def test_stage0_stream_k_matches_mlp(ws, M, H, F_, act, num_sms):
    """Stage 0's stream-K runs (``STAGE0_STREAM_K``): every program an equal share of all tiles' K-steps, each piece
    of a tile in its slot (NaN-poisoned, ``stage0_partial_slots`` a tile), the fix-up kernel adding each tile's pieces: the
    same chunk-major blocks, flags and MLP result as the plain kernel."""
    tp = ws // 2
    fp = F_ // tp
    tiles = -(-M // CFG0[0]) * -(-fp // CFG0[1])
    split = 2  # (any split of more than one run: stream-K takes the fix-up's calls)
    with knobs.cta.patch(**STREAM0):
        assert cta.stage0_streams_k(M, split)
        slots = cta.stage0_partial_slots(M, H, fp, CFG0, split, num_sms)[2]
        accumulators = 2 if act == "swiglu" else 1
        parts = torch.full((cta.split_partials_numel(M, fp, CFG0, slots, accumulators),), float("nan"))
        res = _run(ws, M, H, F_, 32, act, True, transport="ce", num_sms=num_sms,
                   stage0_order=dict(split_k=split, split_partials=parts,
                                     split_counters=torch.zeros(tiles, dtype=torch.int32)))
    _check_staged_blocks_and_result(res, ws)
    assert not parts.isnan().all()


@pytest.mark.parametrize("ws,M,H,F_,act,num_sms,transport", [
    (2, 40, 64, 128, "gelu", 5, "ce"),      # 12 tiles on 5 programs: 2 whole rounds, the last 2 tiles stream-K
    (2, 40, 64, 128, "gelu", 7, "peer"),    # 1 whole round, 5 tiles stream-K, into the consumers' buffers
    (2, 33, 48, 64, "swiglu", 5, "ce"),     # two accumulators
    (4, 20, 64, 256, "gelu", 16, "peer"),   # fewer tiles than programs: every tile stream-K, 2 producers
])
def test_stage0_stream_k_tail_matches_mlp(ws, M, H, F_, act, num_sms, transport):
    """An unsplit stage 0 with its last, partial round stream-K (``STAGE0_STREAM_K_TAIL``): the whole tiles before
    it counted as the fix-up's pieces, the stream-K tiles' pieces in NaN-poisoned slots added by the fix-up kernel:
    the same chunk-major blocks, flags and MLP result, every chunk counter back at 0."""
    tp = ws // 2
    fp = F_ // tp
    tiles = -(-M // CFG0[0]) * -(-fp // CFG0[1])
    with knobs.cta.patch(STAGE0_STREAM_K_TAIL=True, STAGE0_FIXUP_ROWS=8):
        sk = cta.stage0_partial_slots(M, H, fp, CFG0, 1, num_sms, tail=True)[0]
        assert sk == tiles % num_sms and sk > 0
        assert cta.stage0_partial_slots(M, H, fp, CFG0, 1, num_sms)[0] == 0  # (only for a caller that gives a buffer)
        accumulators = 2 if act == "swiglu" else 1
        parts = torch.full((cta.stage0_partials_numel(M, H, fp, CFG0, 1, num_sms, accumulators, tail=True),),
                           float("nan"))
        res = _run(ws, M, H, F_, 32, act, True, transport=transport, num_sms=num_sms,
                   stage0_order=dict(split_partials=parts, stream_k_tail=True))
    _check_staged_blocks_and_result(res, ws)
    assert not parts.isnan().all()


def test_stage0_stream_k_slots_bound_the_pieces_of_a_tile():
    """``stage0_partial_slots``' slots with stream-K: at least the most programs whose shares meet one tile, at every grid size
    (the kernel's shares: ``[p * total // programs, (p + 1) * total // programs)``), never more than its K-steps;
    without stream-K the runs a tile."""
    cfg = (16, 32, 16, 2, 1, 1)
    with knobs.cta.patch(**STREAM0):
        for M, H, Fp in ((40, 64, 128), (16, 2048, 64), (128, 8192, 896), (33, 48, 64)):
            steps = -(-H // cfg[2])
            tiles = -(-M // cfg[0]) * -(-Fp // cfg[1])
            total = tiles * steps
            for programs in (1, 3, 5, 7, 132, total - 1, total, total + 5):
                starts = torch.arange(programs + 1, dtype=torch.int64) * total // programs
                lo, hi = starts[:-1], starts[1:]
                t0 = torch.arange(tiles, dtype=torch.int64)[:, None] * steps
                meets = (lo < hi) & (lo < t0 + steps) & (hi > t0)  # [tile, program]: the share meets the tile
                most = int(meets.sum(1).max())
                slots = cta.stage0_partial_slots(M, H, Fp, cfg, 2, programs)[2]
                assert most <= slots <= steps, (M, H, Fp, programs, most, slots)
    with knobs.cta.patch(STAGE0_STREAM_K=False):
        assert cta.stage0_partial_slots(40, 64, 128, cfg, 3, 5)[2] == 3


@pytest.mark.parametrize("act,split", [("gelu", 3), ("gelu", 4), ("swiglu", 3)])
def test_stage0_split_sums_after_the_runs_have_the_in_kernel_bits(act, split):
    """``STAGE0_SPLIT_FIXUP`` (slots read four at a time, then one by one; SwiGLU's two accumulators one by one) adds
    the runs' slots in run order: the activation's blocks bit-equal to the last run's sum in the kernel."""
    blocks = []
    for sums in (IN_KERNEL0, FIXUP0):
        torch.manual_seed(7)
        parts = torch.full((cta.split_partials_numel(40, 64, CFG0, split, 2),), float("nan"))
        with knobs.cta.patch(**sums):
            res = _run(2, 40, 64, 64, 32, act, True, transport="ce",
                       stage0_order=dict(split_k=split, split_partials=parts,
                                         split_counters=torch.zeros(8, dtype=torch.int32)))
        _check_staged_blocks_and_result(res, 2)
        blocks.append(res["world"].a(1, res["kchunk"])[~res["a_ref"].isnan()])
    assert torch.equal(blocks[0], blocks[1])


@pytest.mark.parametrize("chunks,split_k,runs", [(3, 2, [(0, 1), (1, 3)]), (4, 4, [(0, 1), (1, 2), (2, 3), (3, 4)]),
                                                (5, 3, [(0, 1), (1, 3), (3, 5)])])
@pytest.mark.parametrize("sums", [{"STAGE1_SPLIT_FIXUP": False}, {"STAGE1_SPLIT_FIXUP": False, "SPLIT_SUM_PAIRS": True},
                                  {"STAGE1_FIXUP_ROWS": 4, "STAGE1_FIXUP_CALL_ROWS": ANY_ROWS}],
                         ids=["slot_by_slot", "slot_pairs", "fixup_kernel"])
def test_stage1_split_k_runs_take_contiguous_chunks(chunks, split_k, runs, sums):
    """Run q of a tile sums K-chunks ``[q * n // s, (q + 1) * n // s)`` (its slot, read back), and
    the output is the slots added in run order (the same bits whichever run finished last), whether the last run
    reads the slots one at a time or two (``knobs.cta.SPLIT_SUM_PAIRS``; 3 runs: a pair, then one) or a kernel after
    the runs adds them, a few rows a program (``STAGE1_SPLIT_FIXUP``)."""
    M, N, kchunk = 16, 16, 16
    K = chunks * kchunk
    a, w2 = torch.randn(M, K), torch.randn(K, N)
    out = torch.full((M, N), float("nan"))
    tables = torch.zeros(1, dtype=torch.int64)
    flags = torch.full((64,), EPOCH, dtype=torch.int32)  # every chunk already arrived
    split_counters = torch.zeros(1, dtype=torch.int32)
    parts = torch.full((cta.split_partials_numel(M, N, CFG1, split_k),), float("nan"))
    status = (torch.zeros(1, dtype=torch.int32), torch.zeros(8, dtype=torch.int32))
    with knobs.cta.patch(**sums):
        cta.launch_stage1(chunk_major(a, 1, chunks, kchunk, M), w2, None, out, tables, tables, 0, flags,
                          torch.zeros(64, dtype=torch.int32), torch.tensor([EPOCH], dtype=torch.int32), status, 10**6,
                          0, 1, M, K, 0, kchunk, chunks, 0, 1, CFG1, 3, timed=False, split_k=split_k,
                          split_partials=parts, split_counters=split_counters)
    slots = parts.view(split_k, M, N)
    for q, (lo, hi) in enumerate(runs):
        cols = slice(lo * kchunk, hi * kchunk)
        torch.testing.assert_close(slots[q], a[:, cols] @ w2[cols], atol=1e-4, rtol=1e-4)
    total = torch.zeros(M, N)
    for q in range(split_k):
        total = total + slots[q]
    assert torch.equal(out, total)
    assert split_counters.eq(0).all() and status[1].eq(0).all()


@pytest.mark.parametrize("late,widths", [(2, (16, 16, 16, 16)), (1, (32, 32, 32, 16)), (0, (16, 16, 16, 16))])
def test_stage1_runs_stop_at_a_chunk_not_here(late, widths):
    """Stage 1 reads the chunks already here in one pipelined run (``knobs.cta.STAGE1_READY_RUNS``):
    chunk ``late`` (flag down, data NaN) is written and raised by another thread while the kernel
    runs, so a run that took it before its flag would sum NaN. The result is the reference's, no
    wait gave up, and it has the bits of the chunk-by-chunk loop's (the same dots in the same order);
    ``widths``: with a narrower last chunk (``Fp`` not a multiple of ``kchunk``) too."""
    import threading
    import time

    M, N, kchunk = 16, 16, max(widths)
    K = sum(widths)
    chunks = len(widths)
    a, w2 = torch.randn(M, K), torch.randn(K, N) / K**0.5
    blocks = chunk_major(a, 1, chunks, kchunk, M)
    held = blocks.view(chunks, M, kchunk)[late].clone()
    blocks.view(chunks, M, kchunk)[late] = float("nan")
    flags = torch.full((64,), EPOCH, dtype=torch.int32)
    flags[late] = 0

    def arrive():
        time.sleep(0.3)
        blocks.view(chunks, M, kchunk)[late] = held
        flags[late] = EPOCH

    def stage1(ready_runs):
        out = torch.full((M, N), float("nan"))
        status = (torch.zeros(1, dtype=torch.int32), torch.zeros(8, dtype=torch.int32))
        tables = torch.zeros(1, dtype=torch.int64)
        with knobs.cta.patch(STAGE1_READY_RUNS=ready_runs):
            cta.launch_stage1(blocks, w2, None, out, tables, tables, 0, flags, torch.zeros(64, dtype=torch.int32),
                              torch.tensor([EPOCH], dtype=torch.int32), status, 10**9, 0, 1, M, K, 0, kchunk, chunks,
                              0, 1, (16, 16, 16, 2, 1, 1), 3, timed=False)
        assert status[1].eq(0).all(), status[1]
        return out

    writer = threading.Thread(target=arrive)
    writer.start()
    runs = stage1(True)
    writer.join()
    torch.testing.assert_close(runs, a @ w2, atol=1e-4, rtol=1e-4)
    assert torch.equal(runs, stage1(False))


@pytest.mark.parametrize("transport", ["peer", "ce"])
@pytest.mark.parametrize("ws", [2, 4])
def test_first_row_group_counted_at_once_matches_mlp(ws, transport):
    """Stage 0 counting the first row group's tiles right after their stores (the others a main loop
    later), 8 row blocks in 4 row groups: every flag raised once, every counter back at 0, the same
    result."""
    res = _run(ws, 120, 32, 128 * (ws // 2), 32, "gelu", True, transport=transport,
               stage0_order=dict(count_first_at_once=True))
    world, tp = res["world"], ws // 2
    assert res["groups"] == 4
    for r in range(tp, ws):
        torch.testing.assert_close(world.a(r, res["kchunk"]), res["a_ref"], atol=1e-4, rtol=1e-4, equal_nan=True)
        n_chunk = res["groups"] * tp * res["nch"]
        assert world.flags[r][B + symm_layout.CTA_ARRIVED:B + symm_layout.CTA_ARRIVED + n_chunk].eq(EPOCH).all()
    for r in range(ws):
        torch.testing.assert_close(res["outs"][r], res["y_ref"], atol=1e-4, rtol=1e-4)
        assert world.flags[r][B + symm_layout.CTA_COUNTERS:B + symm_layout.CTA_DONE].eq(0).all()


@pytest.mark.parametrize("ws,M,H,F_,N,act,bias,f1,first", [
    (2, 40, 32, 128, 48, "gelu", True, 0, False),       # rows past M in the tile: TMA writes the padding
    (2, 33, 32, 160, 16, "swiglu", True, 32, True),     # a stage-1 share; the first group counted at once
    (4, 20, 32, 160, 32, "gelu", True, 0, False),       # Fp = 80: the last tile runs past Fp in its block
    (4, 24, 16, 192, 64, "swiglu", False, 64, True),
])
def test_stage0_tma_store_matches_mlp(ws, M, H, F_, N, act, bias, f1, first):
    """Stage 0's staged tiles stored by TMA (``tma_store``, ``knobs.cta.STAGE0_TMA_STORE``): the same
    chunk-major blocks (padding aside), flags and counters as the pointer stores, the MLP's result."""
    res = _run(ws, M, H, F_, N, act, bias, transport="ce", f1=f1,
               stage0_order=dict(tma_store=True, count_first_at_once=first))
    _check_staged_blocks_and_result(res, ws)


def _check_staged_blocks_and_result(res, ws):
    """Every stage-1 rank got the activation's chunk-major blocks (where real: TMA also writes the blocks'
    padding, which nothing reads) and every chunk flag; every rank the MLP's result, no wait given up,
    stage 0's chunk counters back at 0."""
    world, tp = res["world"], ws // 2
    real = ~res["a_ref"].isnan()
    for r in range(tp, ws):
        torch.testing.assert_close(world.a(r, res["kchunk"])[real], res["a_ref"][real], atol=1e-4, rtol=1e-4)
        n_chunk = res["groups"] * tp * res["nch"]
        assert world.flags[r][B + symm_layout.CTA_ARRIVED:B + symm_layout.CTA_ARRIVED + n_chunk].eq(EPOCH).all()
    for r in range(ws):
        assert res["statuses"][r][1].tolist() == [0] * 8, f"rank {r} gave up a wait"
        torch.testing.assert_close(res["outs"][r], res["y_ref"], atol=1e-4, rtol=1e-4)
        assert world.flags[r][B + symm_layout.CTA_COUNTERS:B + symm_layout.CTA_DONE].eq(0).all()


def test_in_kernel_ready_waits_graph_mode():
    """Captured calls wait for the peers' READY inside the kernels (peer stores, both stages)."""
    res = _run(4, 24, 16, 192, 64, "swiglu", True, transport="peer", f1=64, ready=True)
    for r in range(4):
        assert res["statuses"][r][1].tolist() == [0] * 8
        torch.testing.assert_close(res["outs"][r], res["y_ref"], atol=1e-4, rtol=1e-4)


def test_begin_kernel_counts_epochs_on_the_device():
    """begin_kernel: epoch + 1 in the rank's own word, READY[rank] = that epoch in every peer's."""
    world = World(4, 1, 1, 1)
    g = symm_layout.cta_block(True)
    for call in (1, 2, 3):
        for r in range(4):
            cta.launch_begin(world.flags[r][g + symm_layout.CTA_EPOCH:], world.peer_flags, g + symm_layout.CTA_READY, r, 4)
        for r in range(4):
            assert world.flags[r][g + symm_layout.CTA_EPOCH] == call
            ready = world.flags[r][g + symm_layout.CTA_READY:g + symm_layout.CTA_READY + 4].tolist()
            assert ready == [call if p != r else 0 for p in range(4)], (r, ready)
    assert world.flags[0][B + symm_layout.CTA_EPOCH] == 0  # the eager block is untouched


def test_k_chunks_cover_columns_in_whole_tiles():
    for fp in (128, 896, 14336):
        for bn0, bk in ((128, 64), (256, 64)):
            kchunk, nch = k_chunks(fp, bn0, bk, 8, 2)
            assert kchunk % bn0 == 0 and kchunk % bk == 0
            assert (nch - 1) * kchunk < fp <= nch * kchunk
    # Many row groups: fewer, wider chunks so that the flags fit their region.
    kchunk, nch = k_chunks(28672, 128, 64, 1024, 2)
    assert 1024 * 2 * nch <= symm_layout.CTA_CHUNK_WORDS // 2


def test_missing_producer_times_out_with_a_report():
    """Stage 0 rank 1 of 2 never ran: the stage-1 CTAs give up on its first chunk and report it."""
    status = (torch.zeros(1, dtype=torch.int32), torch.zeros(8, dtype=torch.int32))
    _run(4, 16, 16, 128, 32, "gelu", False, status=status, skip_producer=1)
    words = status[1].tolist()
    assert words[0] == 1 and words[1] == OP_CTA_STAGE1.value
    flag, nch = words[3], words[6]
    assert words[4] < EPOCH and words[5] == EPOCH
    err = status_error(words, "", 60.0)
    assert isinstance(err, SymmTimeoutError) and "cta_pipeline_mlp (stage 1)" in str(err)
    # The flag it reports belongs to producer 1: ((g * tp) + p) * nch + j with p == 1.
    assert (flag // nch) % 2 == 1, (flag, nch)


def test_tail_wait_report_names_the_stage0_rank_and_row_block():
    """A stage-1 epilogue that gave up on a stage-0 rank's tail (partial products) says whose and
    which row block: flag ``p * tiles_m + m`` with ``tiles_m`` in the report's count word."""
    from overlap_backend.codegen.flags import OP_CTA_TAIL

    words = [1, OP_CTA_TAIL.value, 3, 1 * 4 + 2, 6, 7, 4, 0]
    err = status_error(words, "", 60.0)
    assert isinstance(err, SymmTimeoutError)
    assert "cta_pipeline_mlp (stage 1, tail)" in str(err) and "row block 2 from stage-0 rank 1" in str(err), str(err)


# ------------------------------------------------------------------ the host path (cta_symm), faked
class FakeRank:
    """What ``cta_symm`` uses of a ``symm.GroupState``, over CPU tensors shared by a fake group: the
    copy engine's pushes and the stream's flag writes happen at once (ctypes), a stream wait checks
    that its flag is already up (in this sequential world it must be)."""

    def __init__(self, group, rank):
        self.group_name, self.group, self.rank, self.ws = "fake", None, rank, group.ws
        self.timeout_ns, self.num_sms, self.epoch, self.push_stream = 10**6, 3, 0, None
        self.g, self.data = group, object()
        self.status = (torch.zeros(1, dtype=torch.int32), torch.zeros(8, dtype=torch.int32))

    def ensure_data(self, nbytes, op=""):
        self.g.ensure(nbytes)

    def data_view(self, dtype, shape, offset=0):
        import math

        n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        return self.g.data[self.rank][offset: offset + n].view(dtype).view(shape)

    def peer_tables(self):
        return (torch.tensor([d.data_ptr() for d in self.g.data], dtype=torch.int64),
                torch.tensor([f.data_ptr() for f in self.g.flags], dtype=torch.int64))

    def flag_arg(self, i):
        return self.g.flags[self.rank][i:]

    def flag_addr(self, i, rank=None):
        return self.g.flags[self.rank if rank is None else rank].data_ptr() + 4 * i

    def status_arg(self):
        return self.status

    def check_status(self):
        pass

    def begin(self, compute, what="a symm call"):
        self.epoch += 1
        for p in range(self.ws):
            if p != self.rank:
                self.g.flags[p][symm_layout.READY + self.rank] = self.epoch
        return self.epoch

    def stream_wait(self, word, value, stream, nbands=1):
        _cuda.wait_value32(self.flag_addr(word), value, stream)

    def push(self, peer, dst_offset, src_ptr, nbytes, flag):
        import ctypes

        assert self.g.flags[self.rank][symm_layout.READY + peer] >= self.epoch, "pushed before the peer was READY"
        ctypes.memmove(self.g.data[peer].data_ptr() + dst_offset, src_ptr, nbytes)
        self.g.flags[peer][flag] = self.epoch

    def end(self, compute):
        pass


class FakeGroup:
    def __init__(self, ws):
        self.ws = ws
        self.data = [torch.zeros(0, dtype=torch.uint8) for _ in range(ws)]
        self.flags = [torch.zeros(symm_layout.FLAG_WORDS, dtype=torch.int32) for _ in range(ws)]
        self.ranks = [FakeRank(self, r) for r in range(ws)]

    def ensure(self, nbytes):
        for r in range(self.ws):
            if self.data[r].numel() < nbytes:
                self.data[r] = torch.full((nbytes,), 255, dtype=torch.uint8)  # NaN-ish garbage for floats


# The CTA knobs a FakeHostPath runs with: interpreter-sized block configs, a wider GELU share window.
FAKE_HOST_KNOBS = dict(STAGE0_CONFIG_FP32=(16, 32, 16, 0, 1, 1), STAGE0_CONFIG_FP32_SWIGLU=(16, 32, 16, 0, 1, 1),
                       STAGE1_CONFIG_FP32=(16, 16, 16, 0, 1, 1), GELU_SHARE_MAX=0.5)


@pytest.fixture
def fake_host_path(monkeypatch):
    """``make(ws, F_, transport, num_sms=None, M=None)``: a FakeHostPath, with its CTA knobs (and the
    stage-0 ``transport``) patched until the test ends."""
    with contextlib.ExitStack() as stack:
        def make(ws, F_, transport, num_sms=None, M=None):
            stack.enter_context(knobs.cta.patch(**FAKE_HOST_KNOBS, TRANSPORT=transport))
            return FakeHostPath(monkeypatch, ws, F_, num_sms=num_sms, M=M)

        yield make


class FakeHostPath:
    """``cta_symm.cta_pipeline_mlp`` run for every rank of a ``FakeGroup`` (stage 0 first, the collect
    kernels deferred until stage 1 ran), with random TP shards of an MLP: M=20 rows, H=16, N=32
    (made by the ``fake_host_path`` fixture, which patches the knobs it needs)."""

    M, H, N = 20, 16, 32

    def __init__(self, monkeypatch, ws, F_, num_sms=None, M=None):
        import ctypes

        from overlap_backend.runtime import cta_symm, cta_weights
        from overlap_backend.runtime import cuda as _cuda

        self.ws, self.F = ws, F_
        self.M = M if M is not None else self.M
        self.group = group = FakeGroup(ws)
        self.current = {"rank": 0}
        self.deferred = []
        self.preloads = []
        f = F_ // ws
        H, N = self.H, self.N
        self.xs = torch.randn(self.M, H)
        self.shards = [dict(w1=torch.randn(H, f) / H**0.5, w3=torch.randn(H, f) / H**0.5,
                            w2=torch.randn(f, N) / F_**0.5, b1=torch.randn(f), b3=torch.randn(f), b2=torch.randn(N))
                       for _ in range(ws)]
        by_ptr = {}
        for name, dim in (("w1", 1), ("w3", 1), ("w2", 0), ("b1", 0), ("b3", 0)):
            full = torch.cat([s[name] for s in self.shards], dim)
            for s in self.shards:
                by_ptr[s[name].data_ptr()] = full
        b2_all = torch.stack([s["b2"] for s in self.shards])

        def gather(t, grp, dim):
            return b2_all if t.dim() == 2 and t.shape[0] == 1 else by_ptr[t.data_ptr()]

        def wait_value32(addr, value, stream):
            assert ctypes.c_int32.from_address(addr).value >= value, "a stream wait on a flag that is not up"

        def write_value32(addr, value, stream):
            ctypes.c_int32.from_address(addr).value = value

        mp = monkeypatch.setattr
        mp(cta_symm, "problem", lambda *a: None)
        mp(cta_symm, "group_size", lambda g: ws)
        mp(cta_symm, "load_kernels", lambda: None)
        mp(cta_weights, "gather", gather)
        mp(cta_symm.symm, "state", lambda name, dev: group.ranks[self.current["rank"]])
        mp(_cuda, "wait_value32", wait_value32)
        mp(_cuda, "write_value32", write_value32)
        mp(torch.cuda, "current_stream", lambda *a: None)
        mp(torch.cuda, "is_current_stream_capturing", lambda: False)
        self.real_collect = cta.launch_collect
        # Collect kernels wait for stage 1, which runs after them in this sequential world: defer them.
        mp(cta, "launch_collect", lambda *a, **k: self.deferred.append((a, {**k, "timed": False})))
        real_stage1 = cta.launch_stage1
        mp(cta, "launch_stage1", lambda *a, **k: real_stage1(*a, **{**k, "timed": False}))
        mp(cta_weights, "placements", {})
        mp(cta_symm, "_preloaded_calls", {})
        real_preloading = cta_symm.launcher.preloading
        mp(cta_symm.launcher, "preloading", lambda: self.preloads.append(1) or real_preloading())
        if num_sms is not None:
            for rk in group.ranks:
                rk.num_sms = num_sms
        self.calls = 0

    def call(self, x, act):
        """One op call on every rank; returns every rank's output."""
        from overlap_backend.runtime import cta_symm

        self.calls += 1
        ws, outs = self.ws, [None] * self.ws
        self.deferred.clear()
        for r in range(ws):  # every rank enters the call (READY in its peers' flags) before any rank's pushes run
            for p in range(ws):
                if p != r:  # never its own: a wait on that would hang on a GPU
                    self.group.flags[p][symm_layout.READY + r] = self.calls
        for r in sorted(range(ws), key=lambda r: r // (ws // 2)):  # stage 0 first
            self.current["rank"] = r
            s = self.shards[r]
            swiglu = act == "swiglu"
            outs[r] = cta_symm.cta_pipeline_mlp(x, s["w1"], s["b1"], s["w3"] if swiglu else None,
                                                s["b3"] if swiglu else None, s["w2"], s["b2"], act,
                                                "tanh" if act == "gelu" else "none", 2, "fake")
        for a, k in self.deferred:
            self.real_collect(*a, **k)
        return outs

    def check_calls(self, act, calls=2):
        """``calls`` op calls on fresh inputs (new epochs, placement reused): no rank gave up a wait,
        and every rank returned the MLP's result, the same bits on every rank (as an all-reduce)."""
        for call in range(calls):
            x = self.xs * (call + 1)
            outs = self.call(x, act)
            ref = self.reference(x, act)
            for r in range(self.ws):
                assert self.group.ranks[r].status[1][0] == 0, f"rank {r} gave up a wait"
                torch.testing.assert_close(outs[r], ref, atol=1e-4, rtol=1e-4)
                assert torch.equal(outs[r], outs[0]), f"rank {r}'s result differs from rank 0's"

    def reference(self, x, act):
        h = [x @ s["w1"] + s["b1"] for s in self.shards]
        if act == "swiglu":
            a_parts = [F.silu(hh) * (x @ s["w3"] + s["b3"]) for hh, s in zip(h, self.shards)]
        else:
            a_parts = [F.gelu(hh, approximate="tanh") for hh in h]
        return sum(a @ s["w2"] + s["b2"] for a, s in zip(a_parts, self.shards))


@pytest.mark.parametrize("transport", ["ce", "peer"])
@pytest.mark.parametrize("ws,act,F_,gelu_shares", [(2, "gelu", 256, (None, None)), (2, "swiglu", 1024, (None, None)),
                                                   (4, "swiglu", 1536, (None, None)), (2, "gelu", 1024, (512, 256)),
                                                   (4, "gelu", 1024, (0, 512))])
def test_host_path_matches_mlp(fake_host_path, ws, act, F_, gelu_shares, transport):
    """``cta_symm.cta_pipeline_mlp`` end to end for every rank of a fake group: weight placement
    (the stage-1 share for SwiGLU), chunking, flag blocks, copy-engine pushes, kernel arguments.
    ``gelu_shares``: the GELU stage-1 share of each call (columns), different from call to call
    as M makes it: the placement, made once, covers both (stage-0 weights are windows of it).
    With room for one row group's stage-1 tiles (8 SMs), the stage-0 tails run too."""
    from overlap_backend.runtime import cta_plan, cta_weights

    fake = fake_host_path(ws, F_, transport, num_sms=8 if gelu_shares[0] is not None else None)
    M, H, N = fake.M, fake.H, fake.N
    for call in range(2):  # a second call: new epoch, placement reused, counters were reset
        with knobs.cta.patch(GELU_SHARE_COLS=gelu_shares[call]):
            if gelu_shares[call] is not None:  # the op's plan takes it
                plan = cta_plan.chunk_plan(M, F_, N, ws // 2, False, torch.float32, 8, H=H)
                assert plan.f1 == gelu_shares[call] and plan.tail > 0 and plan.fship > 0, plan
            x = fake.xs * (call + 1)
            outs = fake.call(x, act)
        ref = fake.reference(x, act)
        for r in range(ws):
            assert fake.group.ranks[r].status[1][0] == 0, f"rank {r} gave up a wait"
            torch.testing.assert_close(outs[r], ref, atol=1e-4, rtol=1e-4)
    if act == "swiglu":
        assert cta_plan.stage1_share(F_, ws // 2, True) > 0  # the share path ran
    assert len(cta_weights.placements) == ws  # one placement per rank, reused by the second call
    # Kernel variants are compiled and loaded once per call signature: the second call preloads
    # only where its plan differs (another GELU share)
    assert len(fake.preloads) == ws * (2 if gelu_shares[0] != gelu_shares[1] else 1), fake.preloads


@pytest.mark.parametrize("ws,F_,M,num_sms,share,transport,ship_first,sk_tail", [
    (2, 1024, 40, 4, None, "ce", True, False), (2, 1024, 40, 4, None, "ce", False, False),
    (2, 1024, 50, 4, 256, "peer", True, False), (4, 1024, 40, 2, None, "ce", True, False),
    (2, 1024, 40, 5, None, "ce", True, True),     # the last round's tiles stream-K (STAGE0_STREAM_K_TAIL)
    (2, 1024, 50, 7, 256, "peer", True, True)])   # ... into the consumers' buffers, with a stage-1 share
def test_host_path_last_group_tail(fake_host_path, ws, F_, M, num_sms, share, transport, ship_first, sk_tail):
    """GELU with more than one row group (``MULTI_GROUP_TAIL``): only the last group has a tail, so
    its rows ship fewer columns and its stage-1 tiles add the tails' partial products, while the
    earlier groups ship and walk every column. The last group smaller than the others (M=40: row
    blocks {0, 1}, {2}), rows not a multiple of the block, with and without a stage-1 share; at 2
    GPUs with the last group's rows shipped before the tails are added (``SHIP_BEFORE_TAILS``: the
    stage-0 rank adds its own copy in its collect) and after (at 4 GPUs the setting does nothing); with stage 0's last,
    partial round of tiles stream-K, its tail tiles among them."""
    from overlap_backend.runtime import cta_plan

    fake = fake_host_path(ws, F_, transport, num_sms=num_sms, M=M)
    with knobs.cta.patch(GELU_SHARE_COLS=share, SHIP_BEFORE_TAILS=ship_first, STAGE0_STREAM_K_TAIL=sk_tail):
        plan = cta_plan.chunk_plan(M, F_, fake.N, ws // 2, False, torch.float32, num_sms, H=fake.H)
        assert plan.groups > 1 and plan.tail > 0 and plan.tail_group == plan.groups - 1, plan
        fp = (F_ - plan.f1) // plan.tp
        assert (cta.stage0_partial_slots(M, fake.H, fp, plan.cfg0, plan.split0, num_sms, tail=True)[0] > 0) == sk_tail
        assert plan.fship < plan.kchunk * plan.nch, plan  # the last group ships fewer chunks than the others
        assert plan.f1 == (share or 0), plan
        fake.check_calls("gelu")
        with knobs.cta.patch(MULTI_GROUP_TAIL=False):
            assert cta_plan.chunk_plan(M, F_, fake.N, ws // 2, False, torch.float32, num_sms, H=fake.H).tail == 0


@pytest.mark.parametrize("ws,F_,M,num_sms,act,share,ship_first,split", [
    (2, 1024, 40, 4, "gelu", None, True, (1, 3)),      # several row groups, the last with tails shipped first
    (2, 1024, 50, 4, "gelu", 256, False, (1, 2)),      # a stage-1 share (own chunks first), tails added before
    (4, 1024, 40, 2, "gelu", None, True, (1, 16)),     # 2 producers; more runs asked than K-chunks
    (4, 1536, 20, 8, "swiglu", None, True, (1, 4)),    # the SwiGLU share, no tails
    (2, 1024, 20, 64, "gelu", None, True, (None, None)),  # the plan's own choice: few tiles on many SMs
    (2, 1024, 40, 4, "gelu", None, True, (2, 1)),      # stage 0 split, with its tails
    (4, 1536, 20, 8, "swiglu", None, True, (3, 2)),    # both stages split, two accumulators in stage 0
])
def test_host_path_split_k(fake_host_path, monkeypatch, ws, F_, M, num_sms, act, share, ship_first, split):
    """Split-K (``STAGE0_SPLIT_K``, ``STAGE1_SPLIT_K``) inside the op, for two calls: with the stage-0
    tails (their partial products added by stage 1's finishing run), a stage-1 share and several row
    groups, every rank returns the MLP's result and every counter is back at 0."""
    from overlap_backend.runtime import cta_plan

    monkeypatch.setattr(FakeHostPath, "H", 48)  # 3 K-steps of 16 for stage 0 to split
    fake = fake_host_path(ws, F_, transport="ce", num_sms=num_sms, M=M)
    with knobs.cta.patch(GELU_SHARE_COLS=share, SHIP_BEFORE_TAILS=ship_first, STAGE0_SPLIT_K=split[0],
                         STAGE1_SPLIT_K=split[1]):
        plan = cta_plan.chunk_plan(M, F_, fake.N, ws // 2, act == "swiglu", torch.float32, num_sms, H=fake.H)
        assert (plan.split0, plan.split1) != (1, 1), plan
        assert split[0] is None or plan.split0 == split[0], plan
        fake.check_calls(act)
    _assert_counters_back_at_zero(fake, ws)


@pytest.mark.parametrize("ws,F_,M,num_sms,act,stage,stream_k", [
    (2, 1024, 40, 4, "gelu", 1, False),  # several row groups, the last one's rows shipped before its tails are added
    (4, 1536, 20, 8, "swiglu", 1, False),  # 2 producers, the SwiGLU share
    (2, 1024, 40, 4, "gelu", 0, False),  # stage 0's: a stage-1 share, the last group's tail tiles kept, the rest staged
    (2, 1024, 40, 5, "gelu", 0, True),   # ... its runs stream-K (STAGE0_STREAM_K), shares across tiles
])
def test_host_path_split_k_summed_after_the_runs(fake_host_path, monkeypatch, ws, F_, M, num_sms, act, stage,
                                                 stream_k):
    """A stage's split tiles summed by the kernel after the runs (``STAGE1_SPLIT_FIXUP`` / ``STAGE0_SPLIT_FIXUP``, a
    few rows a program) inside the op, for two calls: stage 1's tails added to those rows, stage 0's tail tiles kept,
    every rank the MLP's result, every counter back at 0 (stage 1's tails added before the rows go out: the in-kernel
    cases of ``test_host_path_split_k``, the same epilogue)."""
    from overlap_backend.runtime import cta_plan

    monkeypatch.setattr(FakeHostPath, "H", 48)  # 3 K-steps of 16 for stage 0 to split
    fake = fake_host_path(ws, F_, transport="ce", num_sms=num_sms, M=M)
    split = (dict(STAGE1_SPLIT_K=3, STAGE1_FIXUP_ROWS=8, STAGE1_FIXUP_CALL_ROWS=ANY_ROWS) if stage else
             dict(STAGE0_SPLIT_K=3, **FIXUP0, STAGE0_STREAM_K=stream_k, GELU_SHARE_COLS=256))
    with knobs.cta.patch(SHIP_BEFORE_TAILS=True, **split):
        plan = cta_plan.chunk_plan(M, F_, fake.N, ws // 2, act == "swiglu", torch.float32, num_sms, H=fake.H)
        assert (plan.split1 if stage else plan.split0) > 1, plan
        assert stage or plan.tail > 0, plan
        assert stage or cta.stage0_streams_k(M, plan.split0) == stream_k
        fake.check_calls(act)
    _assert_counters_back_at_zero(fake, ws)


def _assert_counters_back_at_zero(fake, ws):
    """Every rank's CTA counters (chunk, row-block and split) at 0 after the op's calls; the done flags are skipped."""
    for r in range(ws):
        words = fake.group.flags[r][B + symm_layout.CTA_COUNTERS:B + symm_layout.CTA_TAIL_ARRIVED]
        words = torch.cat([words[:symm_layout.CTA_DONE - symm_layout.CTA_COUNTERS],
                           words[symm_layout.CTA_Y_COUNTERS - symm_layout.CTA_COUNTERS:]])
        assert words.eq(0).all(), (r, words.nonzero())


def test_split_runs_fill_the_sms_only_at_few_tiles():
    """132 SMs: 8 tiles of 16 K-chunks in 16 runs, 32 tiles of 4 chunks in 4, 64 tiles (over half
    the SMs) in one; never more runs than K-steps, none where the counters would not fit; the knob
    sets the runs of every call."""
    assert cta_plan_split(8, 16) == 16 and cta_plan_split(8, 8) == 8
    assert cta_plan_split(32, 4) == 4 and cta_plan_split(33, 16) == 4
    assert cta_plan_split(66, 16) == 2 and cta_plan_split(67, 16) == 1 and cta_plan_split(256, 16) == 1
    assert cta_plan_split(8, 16, want=1) == 1
    assert cta_plan_split(100, 16, want=6) == 6 and cta_plan_split(100, 4, want=6) == 4
    assert cta_plan_split(256, 16, want=6) == 6
    assert cta_plan_split(symm_layout.CTA_ROW_WORDS // 2 + 1, 16, want=6) == 1  # row and split counters: no room


def test_stage1_takes_narrow_tiles_at_one_split_row_block():
    """16-bit calls of one row block whose stage 1 splits K even with twice the tiles take
    ``STAGE1_CONFIG_DECODE``; more row blocks, float32, no split asked, or too many narrow tiles
    keep ``STAGE1_CONFIG`` (the narrow tiles measured slower there)."""
    from overlap_backend.runtime import cta_plan

    wide, narrow = knobs.cta.STAGE1_CONFIG, knobs.cta.STAGE1_CONFIG_DECODE
    assert wide[1] != narrow[1]

    def stage1(m, ns, dtype=torch.bfloat16, sms=132):
        return cta_plan.block_configs(dtype, False, m, ns, sms)[1]

    assert stage1(16, 2048)[1:3] == narrow[1:3] and stage1(128, 8192)[1:3] == narrow[1:3]  # 64 tiles: 128 <= 132
    assert stage1(128, 8192)[3] == 1 and stage1(128, 8192)[4:] == narrow[4:]
    assert stage1(129, 2048)[1:3] == wide[1:3]  # two row blocks
    assert stage1(16, 8704)[1:3] == wide[1:3]  # 68 narrow tiles: more than half the SMs
    assert stage1(16, 2048, torch.float32) == (*knobs.cta.STAGE1_CONFIG_FP32[:3], 1, *knobs.cta.STAGE1_CONFIG_FP32[4:])
    with knobs.cta.patch(STAGE1_SPLIT_K=1):
        assert stage1(16, 2048)[1:3] == wide[1:3]
    plan = cta_plan.chunk_plan(16, 4096, 2048, 1, False, torch.bfloat16, 132)
    assert plan.cfg1[1] == narrow[1] and plan.split1 > 1, plan


def test_few_rows_take_64_row_blocks_in_both_stages():
    """16-bit calls of at most ``FEW_ROWS`` rows run both stages in 64-row blocks of ``FEW_ROWS_WARPS`` warps,
    each stage's tile width and pipeline kept (stage 1's narrow decode tiles included); more rows, float32, or
    the knob at 0 keep the 128-row configs."""
    from overlap_backend.runtime import cta_plan

    def configs(m, dtype=torch.bfloat16, swiglu=False, ns=2048):
        return cta_plan.block_configs(dtype, swiglu, m, ns, 132)

    few = knobs.cta.FEW_ROWS
    assert few >= 16
    for swiglu in (False, True):
        c0, c1 = configs(few, swiglu=swiglu)
        base0 = knobs.cta.STAGE0_CONFIG_SWIGLU if swiglu else knobs.cta.STAGE0_CONFIG
        assert c0[0] == c1[0] == 64 and c0[5] == c1[5] == knobs.cta.FEW_ROWS_WARPS, (c0, c1)
        assert c0[1:3] == base0[1:3] and c0[4] == base0[4]
        assert c1[1:3] == knobs.cta.STAGE1_CONFIG_DECODE[1:3] and c1[3] == c0[3] == 1
    assert configs(few + 1)[0][0] == configs(few + 1)[1][0] == 128
    assert configs(16, torch.float32)[1] == (*knobs.cta.STAGE1_CONFIG_FP32[:3], 1, *knobs.cta.STAGE1_CONFIG_FP32[4:])
    with knobs.cta.patch(FEW_ROWS_WARPS=4):
        assert configs(16)[0][5] == configs(16)[1][5] == 4
    with knobs.cta.patch(FEW_ROWS=0):
        assert configs(16)[0][0] == 128 and configs(16)[1][5] == knobs.cta.STAGE1_CONFIG_DECODE[5]
    plan = cta_plan.chunk_plan(16, 4096, 2048, 1, False, torch.bfloat16, 132)
    assert plan.cfg0[0] == plan.cfg1[0] == 64 and plan.split1 > 1, plan


def cta_plan_split(tiles, steps, num_sms=132, want=None):
    from overlap_backend.runtime import cta_plan

    return cta_plan.split_runs(tiles, steps, num_sms, want)


@pytest.mark.parametrize("ws,F_,M,num_sms,transport", [(2, 1024, 50, 6, "ce"), (4, 2048, 16, 8, "peer"),
                                                       (2, 512, 20, 6, "ce")])
@knobs.cta.patch(STAGE0_SPLIT_LAST=True)
def test_host_path_split_last_round(fake_host_path, ws, F_, M, num_sms, transport):
    """``STAGE0_SPLIT_LAST``: stage 0's final, partial round of tail tiles made as half-width tiles
    (several row groups, a stage-1 share, one row group) gives every rank the MLP's result."""
    from overlap_backend.runtime import cta_plan

    fake = fake_host_path(ws, F_, transport, num_sms=num_sms, M=M)
    tp = ws // 2
    plan = cta_plan.chunk_plan(M, F_, fake.N, tp, False, torch.float32, num_sms, H=fake.H)
    fp = (F_ - plan.f1) // tp
    bm, bn, group_m = plan.cfg0[0], plan.cfg0[1], plan.cfg0[3]
    assert cta.split_tail_tiles(M, fp, plan.fship, bm, bn, group_m, plan.tail_group, num_sms) > 0, plan
    fake.check_calls("gelu")


def test_split_tail_tiles_takes_only_a_short_last_round_of_tail_tiles():
    """H200 (132 SMs), GELU, F=28672 at 2 GPUs (128x256 tiles): at M=512 stage 0's 316 tiles leave a
    last round of 52, all in the 6144-column tail (96 tiles): split; at M=1024 the last round (108
    tiles) is over half a round: not split; never without a tail, or with a last round that is not
    all tail tiles."""
    assert cta.split_tail_tiles(512, 20224, 14080, 128, 256, 4, 0, 132) == 52
    assert cta.split_tail_tiles(1024, 24576, 16384, 128, 256, 4, 1, 132) == 0  # 768 = 5 x 132 + 108
    assert cta.split_tail_tiles(512, 20224, 20224, 128, 256, 4, 0, 132) == 0  # no tail
    assert cta.split_tail_tiles(512, 20224, 20224 - 2 * 256, 128, 256, 4, 0, 132) == 0  # 8 tail tiles < 52
    assert cta.split_tail_tiles(4096, 27648, 19456, 128, 256, 4, 7, 132) == 24  # 3456 = 26 x 132 + 24
    assert cta.split_tail_tiles(256, 512, 256, 128, 256, 4, 0, 132) == 0  # one round: nothing to split


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("M", [512, 1024, 2048, 4096])
def test_stage0_tail_balances_whole_rounds(M, tp):
    """The tail balances the stages in ``stage_costs``' model of whole rounds (H200: 132 SMs; GELU,
    H=8192, F=28672): a tile of tail more or less would leave them further apart. At M=512 that is
    6144 columns (stage 0's 316 tiles take 3 rounds), in the range measured best on 2xH200
    (4096-6144, 0.45 ms GPU-bound, against 0.48 for the equal-work 8448); with more row groups only
    the last one has a tail."""
    from overlap_backend.runtime import cta_plan

    F_, N = 28672, 8192
    plan = cta_plan.chunk_plan(M, F_, N, tp, False, torch.bfloat16, 132)
    shape = dict(tiles_m=plan.tiles_m, group_m=plan.cfg0[3], bn0=plan.cfg0[1], bn1=plan.cfg1[1], num_sms=132)
    assert plan.tail > 0 and plan.tail_group == plan.groups - 1 and plan.fship + plan.tail == (F_ - plan.f1) // tp

    def gap(tail):
        s0, s1 = cta_plan.stage_costs(F_, N, N, tp, plan.f1, tail, **shape)
        return abs(s0 - s1)

    bn0 = plan.cfg0[1]
    capped = plan.tail + bn0 > plan.window[2]  # TAIL_MAX: the placement keeps no more W2 rows
    assert gap(plan.tail) <= min(gap(plan.tail - bn0), float("inf") if capped else gap(plan.tail + bn0)), plan
    if M == 512 and tp == 1:
        assert plan.groups == 1 and plan.f1 == 8448 and plan.tail == 6144, plan


@pytest.mark.parametrize("ws,F_,M,num_sms,transport", [(2, 2048, 40, 4, "peer"), (4, 3072, 20, 4, "ce")])
@knobs.cta.patch(SWIGLU_SHARE_ROUNDS=True)
def test_host_path_swiglu_share_in_rounds(fake_host_path, ws, F_, M, num_sms, transport):
    """``SWIGLU_SHARE_ROUNDS``: a share other than the balanced-work one (here 256 columns instead of
    512), inside the placement's wider window, gives every rank the MLP's result."""
    from overlap_backend.runtime import cta_plan

    fake = fake_host_path(ws, F_, transport, num_sms=num_sms, M=M)
    plan = cta_plan.chunk_plan(M, F_, fake.N, ws // 2, True, torch.float32, num_sms, H=fake.H)
    assert plan.f1 != cta_plan.stage1_share(F_, ws // 2, True) and plan.f1 > 0, plan
    fake.check_calls("swiglu")


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("M", [128, 512, 1024, 4096])
def test_swiglu_share_in_whole_rounds(M, tp):
    """SwiGLU's stage-1 share is the one, near the balanced-work share, whose longer stage is shortest
    in ``stage_costs``' whole rounds (H200: 132 SMs, H=8192, F=28672): never worse than the
    balanced-work share, and at M=512 (stage 0's 672 tiles: 5.1 rounds) 512 columns more, which make
    stage 0 five rounds (the model's critical path -8 %). The placement's window covers it; with
    ``SWIGLU_SHARE_ROUNDS`` off the share is the balanced-work one."""
    from overlap_backend.runtime import cta_plan

    F_, N = 28672, 8192
    with knobs.cta.patch(SWIGLU_SHARE_ROUNDS=True):
        plan = cta_plan.chunk_plan(M, F_, N, tp, True, torch.bfloat16, 132)
        lo, hi, _ = cta_plan.share_window(F_, tp, True)
    shape = dict(tiles_m=plan.tiles_m, group_m=plan.cfg0[3], bn0=plan.cfg0[1], bn1=plan.cfg1[1], num_sms=132)
    base = cta_plan.stage1_share(F_, tp, True)
    assert lo <= plan.f1 <= hi and lo <= base <= hi and plan.tail == 0, plan
    longer = lambda f1: max(cta_plan.stage_costs(F_, N, 2 * N, tp, f1, 0, **shape))  # noqa: E731
    assert longer(plan.f1) <= longer(base)
    if M == 512 and tp == 1:
        assert (base, plan.f1) == (7168, 7680) and longer(plan.f1) < 0.93 * longer(base)
    with knobs.cta.patch(SWIGLU_SHARE_ROUNDS=False):
        assert cta_plan.chunk_plan(M, F_, N, tp, True, torch.bfloat16, 132).f1 == base
        assert cta_plan.share_window(F_, tp, True)[:2] == (base, base)


def test_missing_tail_times_out_with_a_report(monkeypatch, fake_host_path):
    """A stage-0 rank whose tail never comes (its tail kernel did not run): the stage-1 epilogue gives
    up on the first row block's tail and reports which stage-0 rank and row block it waited for."""
    from overlap_backend.codegen.flags import OP_CTA_TAIL
    from overlap_backend.runtime import cta_plan

    fake = fake_host_path(2, 1024, "ce", num_sms=8)
    assert cta_plan.chunk_plan(fake.M, 1024, fake.N, 1, False, torch.float32, 8, H=fake.H).tail > 0
    monkeypatch.setattr(cta, "launch_tail", lambda *a, **k: None)
    fake.call(fake.xs, "gelu")
    assert fake.group.ranks[0].status[1][0] == 0  # stage 0 waits for nothing of the tails
    words = fake.group.ranks[1].status[1].tolist()
    assert words[0] == 1 and words[1] == OP_CTA_TAIL.value, words
    tiles_m = -(-fake.M // 16)
    assert words[6] == tiles_m and divmod(words[3], tiles_m)[0] == 0, words  # stage-0 rank 0's tail
    err = status_error(words, "", 60.0)
    assert "cta_pipeline_mlp (stage 1, tail)" in str(err) and "from stage-0 rank 0" in str(err), str(err)


def test_placement_is_tied_to_the_weight_storage_not_the_tensor_object():
    """Compiled graphs pass weights as fresh views (``reinterpret_tensor``, ``detach``): a placement
    must stay valid for any view of the same storage, and become invalid when the weight is written
    (version) or its storage is freed."""
    from overlap_backend.runtime.cta_weights import Placement, storage_ref, versions

    w1, w2 = torch.randn(8, 4), torch.randn(4, 8)
    tensors = (w1.t(), None, None, None, w2, None)
    placed = Placement(tuple(None if t is None else storage_ref(t) for t in tensors), versions(tensors))
    assert placed.valid((w1.detach().t(), None, None, None, torch.as_strided(w2, (4, 8), (8, 1)), None))
    assert not placed.valid((torch.randn(8, 4).t(), None, None, None, w2, None))  # another storage
    w2.mul_(2)  # the weight changed
    assert not placed.valid((w1.t(), None, None, None, w2, None))
    placed = Placement(tuple(None if t is None else storage_ref(t) for t in tensors), versions((w1.t(), None, None, None, w2, None)))
    assert placed.valid((w1.t(), None, None, None, w2, None))
    ref = placed.refs[4]
    del w2, tensors
    assert ref.expired()  # freed: no later tensor can match it


@knobs.cta.patch(CACHE_MAX=3)
def test_per_signature_caches_are_bounded():
    """The host path's caches (verdicts, plans, preloaded call signatures) are keyed by shapes: a
    server seeing ever new token counts must not grow them without bound."""
    from overlap_backend.runtime import cta_symm

    cache = {}
    for i in range(7):
        assert cta_symm._cached(cache, i, lambda: i * 10) == i * 10
        assert len(cache) <= 3 and cache[i] == i * 10


def test_staging_buffers_outgrown_after_a_capture_are_kept(monkeypatch):
    """A captured call's graph keeps using the staging buffers it was captured with: once a call was
    captured, a larger call gets a new buffer and the old one is kept, not freed (before any capture
    it is dropped)."""
    from overlap_backend.runtime import cta_symm

    monkeypatch.setattr(cta_symm, "_staging", {})
    monkeypatch.setattr(cta_symm, "_staging_kept", [])
    monkeypatch.setattr(cta_symm, "_captured", False)
    x = torch.zeros(2, 2)
    small = cta_symm._staging_buffer(x, 16, "blocks")
    assert cta_symm._staging_buffer(x, 8, "blocks") is small  # big enough: reused
    cta_symm._staging_buffer(x, 32, "blocks")
    assert cta_symm._staging_kept == []  # nothing captured: the old buffer goes
    monkeypatch.setattr(cta_symm, "_captured", True)
    old = cta_symm._staging_buffer(x, 32, "blocks")
    new = cta_symm._staging_buffer(x, 64, "blocks")
    assert new is not old and new.numel() == 64 and cta_symm._staging_kept == [old]
