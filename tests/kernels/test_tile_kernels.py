"""The symm lowering's Triton tile kernels under ``TRITON_INTERPRET=1`` (CPU), one rank at a time.

Each test plays rank ``r`` of a ``ws``-rank group: what the peers would have delivered is written
into the receive buffers beforehand and the arrival flags are pre-set to the epoch, so the kernel
runs straight through; outputs are poisoned with NaN first. Checked against float32 references:
tile maths and row maps (shapes that do not fill a tile, runs of rows), tile order (which chunks a
kernel reads from the shard vs the buffer, which it stages for the copy engine), the chunk counters
and done flags (reset / raised to the epoch), and the bounded wait: a flag below the epoch makes the
kernel give up and leave a status word that the host turns into an error naming op, rank and flag.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# conftest.py turns the interpreter on where there is no GPU (CI), before Triton is imported.
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("interpreter tests: they run where CUDA is absent (CI); the GPU runs the real kernels "
                "in tests/gpu/test_gpu.py", allow_module_level=True)
triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from overlap_backend.codegen import ag_mm, mm_rs, reduce, tiles  # noqa: E402
from overlap_backend.runtime.symm import SymmTimeoutError, status_error  # noqa: E402

CFG = (16, 16, 16, 2, 1, 1, False)  # BM, BN, BK, GROUP_M, stages, warps, TMA store: small tiles, many
CFG_TMA_STORE = CFG[:6] + (True,)
BAND = 16  # rows per band here (on GPU a multiple of 1024): chunks of more rows travel in several bands
EPOCH = 5
SLOW = settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def _cpu_allocator():
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8))


def _status():
    """(claim word, report): both plain CPU tensors here."""
    return torch.zeros(1, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)


def _chunk(t, c, outer, ws, run):
    """Rows of chunk c of a [outer * ws * run, N] matrix, chunk-major ([outer * run, N])."""
    return t.reshape(outer, ws, run, -1)[:, c].reshape(outer * run, -1)


# ------------------------------------------------------------------------------------ ag_mm
@pytest.fixture(params=[0, 1 << 30], ids=["per_chunk", "whole"])
def ag_reads(request):
    """Both ag_mm kernels: tiles chunk by chunk, and the whole gathered input once every shard is in
    (``knobs.codegen.AG_MM_WHOLE_ROWS``: decode sizes)."""
    from overlap_backend.spec import knobs

    with knobs.codegen.patch(AG_MM_WHOLE_ROWS=request.param):
        yield "whole" if request.param else "per_chunk"


def _run_ag_mm(ws, r, outer, run, K, N, bias, kmajor, flags=None, timeout_ns=10**6, cfg=CFG):
    rows = outer * run
    shards = [torch.randn(outer, run, K) for _ in range(ws)]
    G = torch.cat(shards, dim=1).reshape(-1, K)  # gathered along the run dim
    w = torch.randn(N, K).t() if kmajor else torch.randn(K, N)
    b = torch.randn(N) if bias else None
    buf = torch.stack([s.reshape(rows, K) for s in shards])
    buf[r] = float("nan")  # the own chunk must come from the shard, never the buffer
    out = torch.full((ws * rows, N), float("nan"))
    nbands = -(-rows // BAND)
    flags = torch.full((ws * nbands,), EPOCH, dtype=torch.int32) if flags is None else flags
    status = _status()
    ag_mm.launch(shards[r].reshape(rows, K).contiguous(), buf, w, b, out, flags, EPOCH, status, timeout_ns,
                 r, ws, run, BAND, cfg, 3, timed=False)
    ref = G @ w + (b if b is not None else 0)
    return out, ref, status


@pytest.mark.parametrize("ws,r,outer,run,K,N,bias,kmajor", [
    (2, 0, 1, 5, 32, 24, True, True),      # rows < BM, N not a multiple of BN
    (3, 2, 2, 7, 16, 40, False, False),    # [B, S, K] gathered along S: runs of 7 rows
    (4, 1, 1, 33, 48, 16, True, False),    # rows over two tiles
])
def test_ag_mm_matches_gathered_matmul(ws, r, outer, run, K, N, bias, kmajor, ag_reads):
    out, ref, status = _run_ag_mm(ws, r, outer, run, K, N, bias, kmajor)
    assert status[1].tolist() == [0] * 8
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("by_column", [0, 1 << 30], ids=["chunk_order", "column_order"])
@pytest.mark.parametrize("ws,r,outer,run,K,N,bias,kmajor", [
    (4, 1, 1, 33, 48, 40, True, False),    # rows over three row tiles, N over three column tiles
    (3, 2, 2, 7, 16, 40, False, True),     # [B, S, K] gathered along S
])
def test_ag_mm_both_tile_orders_match(by_column, ws, r, outer, run, K, N, bias, kmajor):
    """Chunk by chunk (the order the shards arrive in) or the peers' tiles column block by column block (short
    chunks: the weight's blocks read once): the same product, every flag checked."""
    from overlap_backend.spec import knobs

    with knobs.codegen.patch(AG_MM_PEERS_BY_COLUMN_ROWS=by_column, AG_MM_WHOLE_ROWS=0):
        out, ref, status = _run_ag_mm(ws, r, outer, run, K, N, bias, kmajor)
    assert status[1].tolist() == [0] * 8
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


@triton.jit
def _tile_positions(out_ptr, tiles_m, tiles_n, WS: tl.constexpr, GROUP_M: tl.constexpr,
                    PEERS_BY_COLUMN: tl.constexpr):
    for tile in range(0, WS * tiles_m * tiles_n):
        pos, pid_m, pid_n = tiles.tile_position(tile, tiles_m, tiles_n, WS, GROUP_M, PEERS_BY_COLUMN)
        tl.store(out_ptr + 3 * tile, pos)
        tl.store(out_ptr + 3 * tile + 1, pid_m)
        tl.store(out_ptr + 3 * tile + 2, pid_n)


@pytest.mark.parametrize("ws,tiles_m,tiles_n", [(4, 1, 5), (8, 2, 3), (2, 3, 4)])
def test_tile_positions_cover_every_tile_once_local_first(ws, tiles_m, tiles_n):
    per = tiles_m * tiles_n
    for by_column in (False, True):
        got = torch.full((ws * per * 3,), -1, dtype=torch.int32)
        _tile_positions[(1,)](got, tiles_m, tiles_n, WS=ws, GROUP_M=2, PEERS_BY_COLUMN=by_column)
        order = [tuple(x) for x in got.view(-1, 3).tolist()]
        assert sorted(order) == [(p, m, n) for p in range(ws) for m in range(tiles_m) for n in range(tiles_n)]
        assert [p for p, _, _ in order[:per]] == [0] * per, "the local shard's tiles first"
        peers = order[per:]
        if by_column:  # every peer's row tiles of one column block in turn, blocks in order
            assert peers == [(p, m, n) for n in range(tiles_n) for p in range(1, ws) for m in range(tiles_m)]
        else:  # chunk by chunk, in arrival order
            assert [p for p, _, _ in peers] == sorted(p for p, _, _ in peers)


@pytest.mark.parametrize("ws,r,rows,N", [(2, 1, 32, 24), (4, 2, 48, 40)])
def test_ag_mm_tma_store_epilogue(ws, r, rows, N, ag_reads):
    # rows a multiple of BM and chunks contiguous: the epilogue stores whole tiles with TMA
    out, ref, status = _run_ag_mm(ws, r, 1, rows, 32, N, True, True, cfg=CFG_TMA_STORE)
    assert status[1][0] == 0
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("whole_rows", [0, 1 << 30], ids=["per_chunk", "whole"])
@SLOW
@given(ws=st.integers(2, 4), data=st.data())
def test_ag_mm_random_shapes(whole_rows, ws, data):
    from overlap_backend.spec import knobs

    r = data.draw(st.integers(0, ws - 1))
    outer, run = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 20))
    K, N = 16 * data.draw(st.integers(1, 3)), 4 * data.draw(st.integers(1, 10))  # TMA: 16-byte rows
    with knobs.codegen.patch(AG_MM_WHOLE_ROWS=whole_rows):
        out, ref, status = _run_ag_mm(ws, r, outer, run, K, N, data.draw(st.booleans()), data.draw(st.booleans()))
    assert status[1][0] == 0
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_ag_mm_wait_gives_up_and_reports(ag_reads):
    ws, r, rows = 3, 0, 20  # two bands per chunk: rows 0-15 and 16-19
    flags = torch.full((ws * 2,), EPOCH, dtype=torch.int32)
    flags[2 * 2 + 1] = EPOCH - 1  # the second band of rank 2's shard never arrives
    out, ref, status = _run_ag_mm(ws, r, 1, rows, 16, 16, False, False, flags=flags, timeout_ns=30_000)
    claim, report = status
    assert claim.item() == 1 and report.tolist()[:7] == [1, 1, r, 5, EPOCH - 1, EPOCH, 2]
    # what did arrive is still right (the first band of rank 2's shard too)
    torch.testing.assert_close(out[: 2 * rows + 16], ref[: 2 * rows + 16], atol=1e-4, rtol=1e-4)
    err = status_error(report.tolist(), "", 2.0)
    assert isinstance(err, SymmTimeoutError)
    assert "ag_mm on rank 0" in str(err) and "flag 5, for band 1 of rank 2's shard" in str(err)
    assert "read 4, expected >= 5" in str(err)
    assert status_error([0] * 8, "", 2.0) is None


# ------------------------------------------------------------------------------------ mm_rs
def _run_mm_rs(ws, r, outer, run, K, N, bias, average, cfg=CFG, late=None, timeout_ns=10**6):
    """Rank r's mm_rs kernel with every peer's partial in ``recv`` and its flag raised (``late``: the index
    of one flag left an epoch behind)."""
    rows = outer * run
    M = ws * rows
    A = [torch.randn(M, K) for _ in range(ws)]
    B = [torch.randn(K, N) for _ in range(ws)]
    b = torch.randn(N) if bias else None
    C = [a @ w + (b if b is not None else 0) for a, w in zip(A, B)]  # every rank's partial
    recv = torch.full((ws * rows, N), float("nan"))
    for p in range(ws):
        if p != r:
            recv[p * rows:(p + 1) * rows] = _chunk(C[p], r, outer, ws, run)
    stage = torch.full((ws * rows, N), float("nan"))
    out = torch.full((rows, N), float("nan"))
    nb = -(-rows // BAND)
    counters = torch.zeros(ws * nb, dtype=torch.int32)
    done = torch.zeros(ws * nb, dtype=torch.int32)
    rflags = torch.full((ws * nb,), EPOCH, dtype=torch.int32)
    if late is not None:
        rflags[late] = EPOCH - 1
    status = _status()
    ticket = torch.zeros(1, dtype=torch.int32)
    mm_rs.launch(A[r], B[r], b, stage, recv, None, out, counters, done, rflags, ticket, EPOCH, status, timeout_ns,
                 r, ws, rows, run, 1, 0, 0, average, BAND, cfg, 4, timed=False)
    assert ticket.item() == 0, "the tile ticket counter is reset for the next call"
    ref = sum(_chunk(c, r, outer, ws, run) for c in C) / (ws if average else 1)
    return out, ref, stage, C[r], counters, done, status


def _check_staged_and_reduced(result, ws, r, rows, outer=1, run=None):
    """Rank r's ``_run_mm_rs`` ``result``: no wait gave up, the own chunk reduced, every remote chunk staged (this
    rank's partial of it: what the copy engine ships) and the own one not, the tile counters reset and every remote
    band's done flag raised."""
    out, ref, stage, mine, counters, done, status = result
    assert status[1][0] == 0
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    for c in range(ws):
        if c != r:
            torch.testing.assert_close(stage[c * rows:(c + 1) * rows], _chunk(mine, c, outer, ws, run or rows),
                                       atol=1e-4, rtol=1e-4)
    assert torch.isnan(stage[r * rows:(r + 1) * rows]).all(), "the own chunk must not be staged"
    nb = -(-rows // BAND)
    assert counters.tolist() == [0] * (ws * nb), "tile counters are reset for the next call"
    assert done.tolist() == [0 if c == r else EPOCH for c in range(ws) for _ in range(nb)], "every band signalled"


@pytest.mark.parametrize("ws,r,outer,run,K,N,bias,average", [
    (2, 1, 1, 9, 32, 20, True, False),
    (3, 0, 2, 16, 16, 40, False, True),   # runs of 16 rows (BM divides the run)
    (4, 3, 1, 40, 48, 16, True, False),
])
def test_mm_rs_stages_remote_chunks_and_reduces_own(ws, r, outer, run, K, N, bias, average):
    _check_staged_and_reduced(_run_mm_rs(ws, r, outer, run, K, N, bias, average), ws, r, outer * run, outer, run)


@pytest.mark.parametrize("ws,r,rows,N,bias,average", [(2, 0, 32, 24, True, False), (4, 2, 48, 40, False, True)])
def test_mm_rs_tma_stages_counts_and_reduces(ws, r, rows, N, bias, average):
    # contiguous chunks whose rows BM divides: remote tiles stored by TMA and counted a main loop
    # later (the last one after the loop), partials loaded and the own tiles stored by TMA
    assert mm_rs.tma_ok(rows, rows, CFG[0], False) and not mm_rs.tma_ok(rows + 1, rows + 1, CFG[0], False)
    assert not mm_rs.tma_ok(rows, rows, CFG[0], True), "peer stores: no staging"
    assert not mm_rs.tma_ok(rows, rows, CFG[0], False, copy_out=True), "mm_ar's copy tiles wait for peers"
    _check_staged_and_reduced(_run_mm_rs(ws, r, 1, rows, 32, N, bias, average, cfg=CFG_TMA_STORE), ws, r, rows)


@pytest.mark.parametrize("cfg", [CFG, CFG_TMA_STORE], ids=["pointer_stores", "tma"])
def test_mm_rs_own_wait_gives_up_and_reports(cfg):
    """A peer's partial of an own band that never arrives: the own tile's wait gives up, the kernel reports it and
    finishes; the band that arrived is right and every remote band is staged and signalled all the same."""
    ws, r, rows = 3, 0, 32  # two bands per chunk: rows 0-15 and 16-31
    late = 2 * 2 + 1  # rank 2's partial of this rank's second band
    out, ref, stage, mine, counters, done, status = _run_mm_rs(ws, r, 1, rows, 16, 40, False, False, cfg=cfg,
                                                               late=late, timeout_ns=30_000)
    claim, report = status
    assert claim.item() == 1 and report.tolist()[:7] == [1, 2, r, late, EPOCH - 1, EPOCH, 2]
    torch.testing.assert_close(out[:16], ref[:16], atol=1e-4, rtol=1e-4)
    assert done.tolist() == [0, 0] + [EPOCH] * 4, "the remote bands are signalled all the same"
    err = status_error(report.tolist(), "", 2.0)
    assert isinstance(err, SymmTimeoutError) and "mm_rs on rank 0" in str(err)


@pytest.fixture
def spanning():
    """``mm_rs``'s tiles spanning chunks shorter than a tile (``knobs.codegen.RS_SPAN_CHUNKS``) on."""
    from overlap_backend.spec import knobs

    with knobs.codegen.patch(RS_SPAN_CHUNKS=True):
        yield


@pytest.mark.parametrize("ws,r,rows,N,bias,average", [
    (2, 0, 8, 40, True, False),   # two chunks a tile: the own group is the only group
    (4, 1, 8, 20, False, True),   # two groups of two
    (4, 3, 4, 24, True, False),   # four chunks a tile
    (8, 5, 8, 16, False, False),  # four groups of two
])
def test_mm_rs_tiles_span_short_chunks(ws, r, rows, N, bias, average, monkeypatch, spanning):
    """Chunks shorter than a tile: each tile covers BM / rows chunks; the remote ones are staged and signalled, the
    own chunk's rows reduced with the peers' partials, the own rows never staged."""
    from overlap_backend.codegen import launcher
    from overlap_backend.spec import knobs

    launched = []
    real_launch = launcher.launch
    monkeypatch.setattr(launcher, "launch", lambda fn, grid, *a, **kw: launched.append(kw["SPAN"]) or real_launch(
        fn, grid, *a, **kw))

    span = mm_rs.span_chunks(rows, rows, CFG[0], ws, False, False)
    assert span == CFG[0] // rows
    assert mm_rs.span_chunks(rows, rows, CFG[0], ws, True, False) == 1, "peer stores: tiles within one chunk"
    assert mm_rs.span_chunks(rows, rows, CFG[0], ws, False, True) == 1, "mm_ar: tiles within one chunk"
    assert mm_rs.span_chunks(rows, rows, CFG[0], 3, False, False) == 1, "the chunks of a tile must divide the group"
    assert mm_rs.span_chunks(rows, rows // 2, CFG[0], ws, False, False) == 1, "runs of rows: tiles within one"
    with knobs.codegen.patch(RS_SPAN_CHUNKS=False):
        assert mm_rs.span_chunks(rows, rows, CFG[0], ws, False, False) == 1
    result = _run_mm_rs(ws, r, 1, rows, 32, N, bias, average)
    assert launched == [span]
    assert rows <= BAND  # one band a chunk
    _check_staged_and_reduced(result, ws, r, rows)


def test_mm_rs_spanning_own_wait_gives_up_and_reports(spanning):
    """A peer's partial that never arrives, tiles spanning chunks: the own tiles give up and report; the remote
    chunks, in the same tiles as the own one, are staged and signalled all the same."""
    ws, r, rows = 2, 1, 8
    out, ref, stage, mine, counters, done, status = _run_mm_rs(ws, r, 1, rows, 16, 24, False, False, late=0,
                                                               timeout_ns=30_000)
    claim, report = status
    assert claim.item() == 1 and report.tolist()[:7] == [1, 2, r, 0, EPOCH - 1, EPOCH, 1]
    assert done.tolist() == [EPOCH, 0], "the remote chunk is signalled before the wait"
    torch.testing.assert_close(stage[:rows], mine[:rows], atol=1e-4, rtol=1e-4)


@SLOW
@given(ws=st.integers(2, 4), data=st.data())
def test_mm_rs_random_shapes(ws, data):
    from overlap_backend.spec import knobs

    with knobs.codegen.patch(RS_SPAN_CHUNKS=data.draw(st.booleans())):
        _random_mm_rs(ws, data)


def _random_mm_rs(ws, data):
    r = data.draw(st.integers(0, ws - 1))
    outer = data.draw(st.integers(1, 2))
    run = 16 * data.draw(st.integers(1, 2)) if outer > 1 else data.draw(st.integers(1, 24))
    out, ref, *_, status = _run_mm_rs(ws, r, outer, run, 16 * data.draw(st.integers(1, 2)),
                                      4 * data.draw(st.integers(1, 10)), data.draw(st.booleans()), False)
    assert status[1][0] == 0
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------------------------ mm_ar
def _run_mm_ar(ws, r, M, rounds, copy_out=False, late=None, cfg=CFG):
    """Rank r's mm_ar rounds kernel with every peer's partial in ``recv``; with ``copy_out`` the peers'
    reduced chunks are in the gather region already (their gathered flags raised, but ``late``: a
    (slot, band) whose flag is one epoch behind). Returns (out, gather, ref, own row mask, done,
    counters, status, nb)."""
    K, N = 32, 24
    rows = -(-M // (rounds * ws))
    padded = rounds * ws * rows
    A = [torch.randn(M, K) for _ in range(ws)]
    B = torch.randn(K, N)
    C = [torch.cat([a @ B, torch.zeros(padded - M, N)]) for a in A]
    ref = sum(C)
    recv = torch.full((padded, N), float("nan"))
    gather = torch.full((padded, N), float("nan"))
    nb = -(-rows // BAND)
    gathered = torch.zeros(rounds * ws * nb, dtype=torch.int32)
    for rnd in range(rounds):
        for p in range(ws):
            if p != r:
                src = (rnd * ws + r) * rows
                recv[(rnd * ws + p) * rows:(rnd * ws + p + 1) * rows] = C[p][src:src + rows]
                slot = rnd * ws + p  # peer p's reduced chunk of this round, as its push leaves it
                gather[slot * rows:(slot + 1) * rows] = ref[slot * rows:(slot + 1) * rows]
                gathered[slot * nb:(slot + 1) * nb] = EPOCH
    if late is not None:
        gathered[late[0] * nb + late[1]] = EPOCH - 1
    out = torch.full((M, N), float("nan"))
    counters = torch.zeros(rounds * ws * nb, dtype=torch.int32)
    done = torch.zeros(rounds * ws * nb, dtype=torch.int32)
    status = _status()
    mm_rs.launch(A[r], B, None, torch.empty(padded, N), recv, gather, out, counters, done,
                 torch.full((rounds * ws * nb,), EPOCH, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), EPOCH,
                 status, 30_000 if late is not None else 10**6,
                 r, ws, rows, rows, rounds, ws * rows, r * rows, False, BAND, cfg, 4, timed=False,
                 gathered=gathered if copy_out else None)
    own_rows = torch.zeros(M, dtype=torch.bool)
    for rnd in range(rounds):
        lo = (rnd * ws + r) * rows
        own_rows[lo:min(lo + rows, M)] = True
    return out, gather, ref, own_rows, done, counters, status, nb


@pytest.mark.parametrize("ws,r,M,rounds,cfg", [
    (3, 2, 90, 2, CFG), (2, 0, 64, 3, CFG), (4, 1, 13, 1, CFG), (2, 1, 150, 2, CFG),
    # TMA stores (chunks of 16 or 32 rows): staged by TMA and counted later, the own tiles loaded and stored by TMA
    # at their round's rows of out (the last round's padding past M clipped), the gather copy by pointers
    (2, 0, 64, 2, CFG_TMA_STORE), (3, 2, 96, 2, CFG_TMA_STORE), (2, 1, 125, 2, CFG_TMA_STORE),
    (2, 1, 125, 2, CFG[:6] + ("tma_subtile",)), (4, 3, 64, 1, CFG_TMA_STORE),
], ids=lambda v: {False: "pointer", True: "tma"}.get(v[6], v[6]) if isinstance(v, tuple) else None)
def test_mm_ar_rounds_reduce_and_gather_own_chunks(ws, r, M, rounds, cfg):
    out, gather, ref, own_rows, done, counters, status, nb = _run_mm_ar(ws, r, M, rounds, cfg=cfg)
    assert status[1][0] == 0
    rows = -(-M // (rounds * ws))
    for rnd in range(rounds):
        lo = (rnd * ws + r) * rows
        hi = min(lo + rows, M)
        torch.testing.assert_close(gather[lo:lo + rows][: max(hi - lo, 0)], ref[lo:hi], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out[own_rows], ref[:M][own_rows], atol=1e-4, rtol=1e-4)
    assert torch.isnan(out[~own_rows]).all(), "other ranks' rows arrive by copy, not from this kernel"
    assert done.tolist() == [EPOCH] * (rounds * ws * nb), "every band, own included (all-gather), is signalled"
    assert counters.tolist() == [0] * (rounds * ws * nb)


@pytest.mark.parametrize("ws,r,M,rounds", [(3, 2, 90, 2), (2, 0, 64, 3), (4, 1, 13, 1), (2, 1, 150, 2), (2, 0, 40, 1)])
def test_mm_ar_copy_tiles_bring_the_peers_chunks_into_out(ws, r, M, rounds):
    """COPY_OUT: the kernel's copy tiles copy every peer's gathered chunk into ``out`` (rows past M
    left out), so the whole output is the all-reduce; the GEMM tiles' counting is unchanged."""
    out, _, ref, _, done, counters, status, nb = _run_mm_ar(ws, r, M, rounds, copy_out=True)
    assert status[1][0] == 0
    torch.testing.assert_close(out, ref[:M], atol=1e-4, rtol=1e-4)
    assert done.tolist() == [EPOCH] * (rounds * ws * nb) and counters.tolist() == [0] * (rounds * ws * nb)


@SLOW
@given(ws=st.integers(2, 4), data=st.data())
def test_mm_ar_copy_tiles_random_shapes(ws, data):
    r = data.draw(st.integers(0, ws - 1))
    rounds = data.draw(st.integers(1, 4))
    M = data.draw(st.integers(1, 48 * ws * rounds))
    out, _, ref, _, done, counters, status, nb = _run_mm_ar(ws, r, M, rounds, copy_out=True)
    assert status[1][0] == 0
    torch.testing.assert_close(out, ref[:M], atol=1e-4, rtol=1e-4)
    assert counters.tolist() == [0] * (rounds * ws * nb)


@pytest.mark.parametrize("tiles,copies,rounds", [(6, 4, 3), (4, 2, 1), (3, 3, 2)])
def test_copy_out_order_puts_each_rounds_copies_after_the_next_rounds_gemm(tiles, copies, rounds):
    """The ticket order of COPY_OUT: every GEMM and copy index exactly once; round t's copy tiles after
    round t + 1's GEMM tiles (the last round's at the end)."""
    import triton
    import triton.language as tl

    @triton.jit
    def order_kernel(kinds_ptr, index_ptr, gemm_per_round, copy_per_round, rounds):
        t = tl.program_id(0)
        is_copy, index = mm_rs._copy_out_order(t, gemm_per_round, copy_per_round, rounds)
        tl.store(kinds_ptr + t, is_copy.to(tl.int32))
        tl.store(index_ptr + t, index)

    n = rounds * (tiles + copies)
    kinds, index = torch.full((n,), -1, dtype=torch.int32), torch.full((n,), -1, dtype=torch.int32)
    order_kernel[(n,)](kinds, index, tiles, copies, rounds)
    seq = [("copy" if k else "gemm", i) for k, i in zip(kinds.tolist(), index.tolist())]
    want = [("gemm", i) for i in range(tiles)]
    for t in range(1, rounds):
        want += [("gemm", t * tiles + i) for i in range(tiles)] + [("copy", (t - 1) * copies + i) for i in range(copies)]
    want += [("copy", (rounds - 1) * copies + i) for i in range(copies)]
    assert seq == want


def test_mm_ar_copy_tile_wait_gives_up_and_reports():
    """A peer's reduced band that never arrives: the copy tile's bounded wait reports it (flag
    GATHER_FLAG_BASE + index), named as the host will describe it."""
    ws, r, M, rounds = 2, 0, 128, 2  # chunks of 32 rows: two bands
    slot, band = 1 * ws + 1, 1  # rank 1's reduced rows of round 1, second band
    out, _, ref, _, _, _, status, nb = _run_mm_ar(ws, r, M, rounds, copy_out=True, late=(slot, band))
    claim, report = status
    flag = slot * nb + band
    assert claim.item() == 1 and report.tolist()[:7] == [1, 3, r, 2000 + flag, EPOCH - 1, EPOCH, nb], report
    err = status_error(report.tolist(), "", 2.0)
    assert isinstance(err, SymmTimeoutError) and "mm_ar on rank 0" in str(err)
    assert f"band {band} of gathered slot {slot} to arrive" in str(err), str(err)


@pytest.mark.parametrize("average", [False, True])
def test_oneshot_sum(average):
    ws, r, M, N = 3, 1, 9, 300
    parts = [torch.randn(M, N) for _ in range(ws)]
    recv = torch.cat(parts)
    recv[r * M:(r + 1) * M] = float("nan")
    out = torch.full((M, N), float("nan"))
    status = _status()
    reduce.launch(parts[r], recv, out, torch.full((ws,), EPOCH, dtype=torch.int32), EPOCH, status, 10**6,
                  r, ws, average, timed=False)
    torch.testing.assert_close(out, sum(parts) / (ws if average else 1), atol=1e-5, rtol=1e-5)
    assert status[1][0] == 0


# ------------------------------------------------------------------- mm_rs / mm_ar, peer stores
@pytest.mark.parametrize("ws,r,M,rounds,gather", [(3, 1, 96, 1, False), (2, 0, 150, 2, True), (4, 3, 64, 1, True)])
def test_peer_store_transport(ws, r, M, rounds, gather):
    """PEER_STORE: remote partials land in their owners' receive buffers and raise the owners' flags;
    with gather (mm_ar) the reduced bands land in every peer's gather buffer, flagged there."""
    K, N = 32, 24
    rows = -(-M // (rounds * ws))
    padded = rounds * ws * rows
    nb = -(-rows // BAND)
    A = [torch.randn(M, K) for _ in range(ws)]
    B = torch.randn(K, N)
    C = [torch.cat([a @ B, torch.zeros(padded - M, N)]) for a in A]
    total = sum(C)
    # every rank's data buffer: receive region, then gather region; every rank's flag buffer
    data = [torch.full((2 * padded, N), float("nan")) for _ in range(ws)]
    RS_WORD, AG_WORD = 0, rounds * ws * nb
    flags = [torch.zeros(2 * rounds * ws * nb, dtype=torch.int32) for _ in range(ws)]
    for rnd in range(rounds):  # what the peers shipped to this rank, already here
        for p in range(ws):
            if p != r:
                src = (rnd * ws + r) * rows
                data[r][(rnd * ws + p) * rows:(rnd * ws + p + 1) * rows] = C[p][src:src + rows]
                flags[r][RS_WORD + (rnd * ws + p) * nb:(rnd * ws + p + 1) * nb] = EPOCH
    peer = dict(data=torch.tensor([d.data_ptr() for d in data], dtype=torch.int64),
                flags=torch.tensor([f.data_ptr() for f in flags], dtype=torch.int64),
                ready=torch.full((ws,), EPOCH, dtype=torch.int32), gather_offset=padded * N * 4,
                rs_flag_word=RS_WORD, ag_flag_word=AG_WORD)
    out = torch.full((M, N) if gather else (rows, N), float("nan"))
    counters = torch.zeros(rounds * ws * nb, dtype=torch.int32)
    status = _status()
    mm_rs.launch(A[r], B, None, None, data[r][:padded], data[r][padded:] if gather else None, out, counters,
                 torch.zeros_like(counters), flags[r][RS_WORD:], torch.zeros(1, dtype=torch.int32), EPOCH, status,
                 10**6, r, ws, rows, rows, rounds, ws * rows if gather else 0, r * rows if gather else 0, False, BAND,
                 CFG, 4, timed=False, peer=peer)
    assert status[1][0] == 0 and counters.tolist() == [0] * len(counters)
    for rnd in range(rounds):
        own = rnd * ws + r
        lo = own * rows
        valid = max(min(rows, M - lo), 0)
        if gather:
            torch.testing.assert_close(out[lo:lo + valid], total[lo:lo + valid], atol=1e-4, rtol=1e-4)
        else:
            torch.testing.assert_close(out, total[lo:lo + rows], atol=1e-4, rtol=1e-4)
        for c in range(ws):
            if c == r:
                continue
            src = (rnd * ws + c) * rows  # this rank's partial of the rows rank c owns in this round
            got = data[c][(rnd * ws + r) * rows:(rnd * ws + r + 1) * rows]
            torch.testing.assert_close(got, C[r][src:src + rows], atol=1e-4, rtol=1e-4)
            assert flags[c][RS_WORD + own * nb:RS_WORD + (own + 1) * nb].tolist() == [EPOCH] * nb
            if gather:
                torch.testing.assert_close(data[c][padded + lo:padded + lo + valid], total[lo:lo + valid],
                                           atol=1e-4, rtol=1e-4)
                assert flags[c][AG_WORD + own * nb:AG_WORD + (own + 1) * nb].tolist() == [EPOCH] * nb


def test_peer_store_ready_wait_gives_up_and_reports():
    """PEER_STORE: a peer that never started its call (its READY one epoch behind): the kernel's bounded
    wait reports flag 1000 + peer, which the host names as that READY (the kernel then finishes, its
    stores garbage, as after any timeout). This report (READY_FLAG_BASE + a tensor) broke under the
    interpreter before the tensor came first."""
    ws, r, M, K, N = 2, 0, 32, 16, 16
    rows = M // ws
    data = [torch.full((rows * ws, N), float("nan")) for _ in range(ws)]
    flags = [torch.full((ws,), EPOCH, dtype=torch.int32) for _ in range(ws)]
    peer = dict(data=torch.tensor([d.data_ptr() for d in data], dtype=torch.int64),
                flags=torch.tensor([f.data_ptr() for f in flags], dtype=torch.int64),
                ready=torch.tensor([EPOCH, EPOCH - 1], dtype=torch.int32), gather_offset=0,
                rs_flag_word=0, ag_flag_word=0)
    counters = torch.zeros(ws, dtype=torch.int32)
    status = _status()
    mm_rs.launch(torch.randn(M, K), torch.randn(K, N), None, None, data[r], None, torch.empty(rows, N), counters,
                 torch.zeros_like(counters), flags[r], torch.zeros(1, dtype=torch.int32), EPOCH, status, 30_000,
                 r, ws, rows, rows, 1, 0, 0, False, BAND, CFG, 4, timed=False, peer=peer)
    claim, report = status
    assert claim.item() == 1 and report.tolist()[:6] == [1, 2, r, 1001, EPOCH - 1, EPOCH], report
    err = status_error(report.tolist(), "", 2.0)
    assert "mm_rs on rank 0" in str(err) and "rank 1 to start this call (its READY flag)" in str(err), str(err)


def test_symm_ops_under_cuda_graph_capture(monkeypatch):
    """Inside a capture: ag_mm / mm_rs / mm_ar run on symm with the toggling flag block only with
    CAPTURE_ON_SYMM (else p2p), and only on a state, buffer and block configs that eager calls set up
    (setting them up synchronises)."""
    import types

    import torch

    from overlap_backend.runtime.symm import lowering_helpers, registry
    from overlap_backend.spec import knobs

    cuda_tensor = types.SimpleNamespace(is_cuda=True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert lowering_helpers.capture_problem(cuda_tensor) is None and not lowering_helpers.capturing(cuda_tensor)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with knobs.symm.patch(CAPTURE_ON_SYMM=False):
        assert "CUDA-graph capture" in lowering_helpers.capture_problem(cuda_tensor)
    with knobs.symm.patch(CAPTURE_ON_SYMM=True):
        assert lowering_helpers.capture_problem(cuda_tensor) is None and lowering_helpers.capturing(cuda_tensor)
        assert lowering_helpers.capture_problem(types.SimpleNamespace(is_cuda=False)) is None

    # a captured call never sets a group up (collective) ...
    monkeypatch.setattr(registry, "states", {})
    st, why = lowering_helpers.call_state("tp", torch.device("cpu"), graph=True)
    assert st is None and "warm up eagerly" in why
    # ... nor grows the buffer or tunes a block config (both synchronise)
    fake = types.SimpleNamespace(data=types.SimpleNamespace(nbytes=1 << 20))
    fit = lowering_helpers.captured_call_problem
    assert fit(fake, 1 << 20, [(128, 256, 64, 8, 3, 8, False)]) is None
    assert "grow" in fit(fake, (1 << 20) + 1, [(128, 256, 64, 8, 3, 8, False)])
    assert "tuned" in fit(fake, 1 << 10, [None])
    assert "grow" in fit(types.SimpleNamespace(data=None), 1, [])


@pytest.mark.parametrize("variant", ["plain", "ticket_for", "guarded", "ticket_static", "subtile", "flatten",
                                     "subtile_flatten"])
def test_probe_plain_gemm_variants_match_the_reference(variant):
    """bench/probes/probe_ws.py's plain persistent GEMM (the yardstick its GPU timings compare the op kernels
    with): every loop / epilogue variant computes act(A @ B), partial edge tiles included."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from bench.probes import probe_ws

    M, K, N = 40, 64, 96  # 2 x 2 tiles of 32 x 64, the last row tile partial
    a, b = torch.randn(M, K), torch.randn(K, N) / 8
    ticket = torch.zeros(1, dtype=torch.int32)
    ws = probe_ws.LOOP_VARIANTS[variant]
    for epi in ("none", "gelu"):
        c = torch.full((M, N), float("nan"))
        probe_ws.persistent_gemm[(2,)](a, b, c, ticket, M, N, K, BM=32, BN=64, BK=32, GROUP_M=8, NUM_SMS=2, WS=False,
                                       EPI=probe_ws.EPILOGUES[epi], TICKET_FOR=ws == "ticket_for",
                                       SUBTILE="subtile" in str(ws), FLATTEN="flatten" in str(ws),
                                       GUARDED=ws == "guarded", TICKET_STATIC=ws == "ticket_static")
        torch.testing.assert_close(c, probe_ws._reference(a @ b, epi), rtol=1e-4, atol=1e-4)
    # the ticket loop leaves its counter at 0 for the next call; ticket_static draws once per program and step:
    # two calls of 2 programs, each over 4 tiles // 2 programs + 1 steps
    assert int(ticket) == (2 * 2 * (4 // 2 + 1) if ws == "ticket_static" else 0)
