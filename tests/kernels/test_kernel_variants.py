"""The store variants of the ag_mm consumer and mm_rs producer kernels (``codegen/configs.py``:
TMA stores with the epilogue in two column halves, a warp-specialized tile loop) under
``TRITON_INTERPRET=1``, against float32 references on random inputs, outputs poisoned first, flags
pre-set as in test_tile_kernels.py: the same results, counters and done flags as the plain kernels."""

from __future__ import annotations

import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("interpreter tests: they run where CUDA is absent (CI)", allow_module_level=True)
triton = pytest.importorskip("triton")
from test_tile_kernels import BAND, EPOCH, _check_staged_and_reduced, _run_ag_mm, _run_mm_rs  # noqa: E402

from overlap_backend.codegen import ag_mm, configs, mm_rs  # noqa: E402
from overlap_backend.codegen import epilogue as gen  # noqa: E402
from overlap_backend.spec import knobs  # noqa: E402

SMALL = (16, 32, 16, 2, 1, 1)  # BN 32: two column halves of 16


@pytest.fixture(autouse=True)
def _cpu_allocator(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8))


@pytest.mark.parametrize("store", ["tma_subtile", "tma_ws", "tma_flatten", "tma_subtile_flatten"])
@pytest.mark.parametrize("ws,r,rows,N,bias,kmajor", [(2, 1, 32, 40, True, True), (4, 2, 48, 24, False, False)])
def test_ag_mm_store_variants(store, ws, r, rows, N, bias, kmajor):
    # N not a multiple of BN: the second half of the last column tile is partly (or wholly) outside
    out, ref, status = _run_ag_mm(ws, r, 1, rows, 32, N, bias, kmajor, cfg=SMALL + (store,))
    assert status[1][0] == 0
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_ag_mm_flattened_wait_gives_up_and_reports():
    """The flattened loop's loads take their row from the wait's result: a wait that gives up still ends the
    kernel and reports, and the tiles of the bands that arrived are right."""
    ws, r, rows = 3, 0, 32  # two bands per chunk: rows 0-15 and 16-31
    flags = torch.full((ws * 2,), EPOCH, dtype=torch.int32)
    flags[2 * 2 + 1] = EPOCH - 1  # the second band of rank 2's shard never arrives
    out, ref, status = _run_ag_mm(ws, r, 1, rows, 16, 40, False, False, flags=flags, timeout_ns=30_000,
                                  cfg=SMALL + ("tma_flatten",))
    claim, report = status
    assert claim.item() == 1 and report.tolist()[:7] == [1, 1, r, 5, EPOCH - 1, EPOCH, 2]
    torch.testing.assert_close(out[: 2 * rows + 16], ref[: 2 * rows + 16], atol=1e-4, rtol=1e-4)


def test_mm_rs_refuses_loops_it_does_not_have():
    """The producer's tiles come from an atomic ticket: the Triton kernel's warp-specialized or flattened loops are
    an error, not a silently different kernel; so is a Gluon form where it cannot run (the interpreter)."""
    for store in ("tma_ws", "tma_flatten"):
        with pytest.raises(ValueError, match="no warp-specialized or flattened"):
            _run_mm_rs(2, 0, 1, 32, 32, 40, False, False, cfg=SMALL + (store,))
    for store in ("ws_pingpong", "ws_pingpong_direct", "ws_coop"):
        with pytest.raises(ValueError, match="interpreter"):
            _run_mm_rs(2, 0, 1, 32, 32, 40, False, False, cfg=SMALL + (store,))


def test_mm_rs_ws_refuses_what_it_does_not_do(monkeypatch):
    """The Gluon producer runs mm_rs and mm_ar's rounds where its TMA stores apply and nothing else: peer stores,
    mm_ar's copy tiles, runs of rows, rows a tile does not divide, float32, another output dtype or 8 warps are errors
    (the tuner then drops the config)."""
    from overlap_backend.codegen import gluon_ring, launcher, mm_rs_ws

    monkeypatch.setattr(launcher, "interpreting", lambda: False)
    cfg, bf16 = (128, 128, 64, 8, 4, 4, "ws_pingpong"), torch.bfloat16
    assert mm_rs_ws.unsupported(1024, 1024, cfg, bf16, bf16, False) is None
    assert mm_rs_ws.unsupported(1024, 1024, cfg[:6] + ("ws_pingpong_direct",), bf16, bf16, False) is None
    coop = (128, 256, 64, 8, 3, 4, "ws_coop")
    assert mm_rs_ws.unsupported(1024, 1024, coop, bf16, bf16, False) is None
    assert "64" in mm_rs_ws.unsupported(1024, 1024, (64,) + coop[1:], bf16, bf16, False)  # 32 rows a warpgroup
    assert "store field" in mm_rs_ws.unsupported(1024, 1024, cfg[:6] + ("tma_ws",), bf16, bf16, False)
    assert "copy-engine" in mm_rs_ws.unsupported(1024, 1024, cfg, bf16, bf16, True)
    assert "copy tiles" in mm_rs_ws.unsupported(1024, 1024, cfg, bf16, bf16, False, copy_out=True)
    assert "contiguous" in mm_rs_ws.unsupported(1024, 512, cfg, bf16, bf16, False)
    assert "contiguous" in mm_rs_ws.unsupported(1000, 1000, cfg, bf16, bf16, False)
    assert "16-bit" in mm_rs_ws.unsupported(1024, 1024, cfg, torch.float32, torch.float32, False)
    assert "output" in mm_rs_ws.unsupported(1024, 1024, cfg, bf16, torch.float32, False)
    assert "num_warps" in mm_rs_ws.unsupported(1024, 1024, cfg[:5] + (8, cfg[6]), bf16, bf16, False)
    # its own tile's epilogue (the partials' sum): GLUON_EPILOGUE_VALUES values a thread of the warpgroup a piece,
    # one 16-byte vector at least
    with knobs.codegen.patch(GLUON_EPILOGUE_VALUES=32):
        assert gluon_ring.epilogue_values() == 32
    with knobs.codegen.patch(GLUON_EPILOGUE_VALUES=0):
        assert gluon_ring.epilogue_values() == 8


def test_mm_ar_tunes_over_a_measured_gluon_form_where_its_tiles_fit_the_rounds():
    """mm_ar's rounds take the Gluon producer where it measured faster and BM divides the chunks' rows, whether or not
    the Triton kernel's TMA variants are on (the Gluon form stores only by TMA)."""
    from overlap_backend.runtime.symm.mm_ar import ar_candidates

    gluon = (128, 128, 64, 8, 4, 4, "ws_pingpong")
    base = ar_candidates(torch.bfloat16, 1024, "off")
    assert ar_candidates(torch.bfloat16, 1024, "off", gluon) == base + [gluon]
    assert ar_candidates(torch.bfloat16, 1000, "off", gluon) == ar_candidates(torch.bfloat16, 1000, "off")
    assert gluon in ar_candidates(torch.bfloat16, 1024, "only", gluon)


def test_ag_mm_subtile_with_generated_epilogue():
    ws, r, rows, K, N = 2, 0, 32, 16, 40
    shards = [torch.randn(rows, K) for _ in range(ws)]
    w, bias = torch.randn(K, N), torch.randn(N)
    resid = torch.randn(ws * rows, N)
    out = torch.full((ws * rows, N), float("nan"))
    g = gen.build("bias:0,gelu,add:1", torch.float32)
    extra = torch.randn(N)
    ag_mm.launch(shards[r], torch.stack(shards), w, bias, out, torch.full((ws * 2,), EPOCH, dtype=torch.int32), EPOCH,
                 (torch.zeros(1, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)), 10**6, r, ws, rows, BAND,
                 SMALL + ("tma_subtile",), 3, timed=False, epilogue=g, ep_ptrs=gen.pointers(g, [extra, resid]))
    h = torch.cat(shards) @ w + bias + extra
    ref = torch.nn.functional.gelu(h) + resid
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("ws,r,rows,N,bias,average", [(2, 0, 32, 40, True, False), (4, 3, 48, 24, False, True),
                                                      (3, 1, 16, 16, False, False)])  # 3 tiles, 4 programs
def test_mm_rs_subtile_stages_counts_and_reduces(ws, r, rows, N, bias, average):
    _check_staged_and_reduced(_run_mm_rs(ws, r, 1, rows, 32, N, bias, average, cfg=SMALL + ("tma_subtile",)), ws, r,
                              rows)


def test_mm_rs_subtile_own_chunk_epilogue():
    ws, r, rows, K, N = 2, 1, 32, 16, 40
    A = [torch.randn(ws * rows, K) for _ in range(ws)]
    B = [torch.randn(K, N) for _ in range(ws)]
    C = [a @ b for a, b in zip(A, B)]
    recv = torch.full((ws * rows, N), float("nan"))
    recv[(1 - r) * rows:(2 - r) * rows] = C[1 - r][r * rows:(r + 1) * rows]
    out = torch.full((rows, N), float("nan"))
    resid = torch.randn(rows, N)
    g = gen.build("add:0,silu", torch.float32)
    nb = -(-rows // BAND)
    mm_rs.launch(A[r], B[r], None, torch.full((ws * rows, N), float("nan")), recv, None, out,
                 torch.zeros(ws * nb, dtype=torch.int32), torch.zeros(ws * nb, dtype=torch.int32),
                 torch.full((ws * nb,), EPOCH, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), EPOCH,
                 (torch.zeros(1, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)), 10**6, r, ws, rows, rows, 1,
                 0, 0, False, BAND, SMALL + ("tma_subtile",), 4, timed=False, epilogue=g, ep_ptrs=gen.pointers(g, [resid]))
    ref = torch.nn.functional.silu(sum(c[r * rows:(r + 1) * rows] for c in C) + resid)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_variant_candidates_fit_the_problem():
    with knobs.codegen.patch(VARIANTS_16BIT={"mm_rs": ((128, 256, 64, 8, 3, 8, "tma_subtile"),
                                                       (64, 256, 64, 8, 3, 8, False))}):
        assert configs.variant_candidates(torch.bfloat16, "mm_rs", tma_store_rows=1024) == [
            (128, 256, 64, 8, 3, 8, "tma_subtile"), (64, 256, 64, 8, 3, 8, False)]
        # no TMA stores where chunks are not whole tiles; BM must divide the runs
        assert configs.variant_candidates(torch.bfloat16, "mm_rs", row_multiple=64) == [(64, 256, 64, 8, 3, 8, False)]
        assert configs.variant_candidates(torch.float32, "mm_rs", tma_store_rows=1024) == []
        base = configs.candidates(torch.bfloat16, tma_store_rows=1024, kernel="mm_rs")
        assert configs.candidates(torch.bfloat16, tma_store_rows=1024, kernel="mm_rs", variants=True)[:len(base)] == base
        assert len(configs.candidates(torch.bfloat16, tma_store_rows=1024, kernel="mm_rs", variants=True)) == len(base) + 2
    with pytest.raises(ValueError, match="store variant"):
        configs.store_variant("subtile")


def test_a_measured_variant_joins_the_candidates_where_it_fits():
    base = configs.candidates(torch.bfloat16, tma_store_rows=1024)
    flat = (128, 256, 64, 8, 4, 8, "tma_subtile_flatten")
    assert configs.candidates(torch.bfloat16, tma_store_rows=1024, measured=flat) == base + [flat]
    assert configs.candidates(torch.bfloat16, tma_store_rows=1024, measured=list(base[0])) == base  # already there
    assert flat not in configs.candidates(torch.bfloat16, tma_store_rows=None, measured=flat)  # no TMA stores here
    assert flat not in configs.candidates(torch.bfloat16, tma_store_rows=1000, measured=flat)  # BM does not divide
    narrow = (64, 256, 64, 8, 3, 8, False)
    assert configs.candidates(torch.bfloat16, 64, measured=narrow)[-1] == narrow
    assert (128, 256, 64, 4, 3, 8, False) not in configs.candidates(torch.bfloat16, 64, measured=(128, 256, 64, 4, 3, 8,
                                                                                                   False))
    assert configs.candidates(torch.float32, measured=narrow) == configs.candidates(torch.float32)


def test_ag_mm_ws_refuses_what_it_does_not_do(monkeypatch):
    """The Gluon kernel runs only what it implements: under the interpreter, at decode sizes (the whole-input
    kernel's), for runs of rows or rows a tile does not divide, float32, or 8 warps, the launch is an error (the tuner
    then drops the config), never another kernel's result."""
    from overlap_backend.codegen import ag_mm_ws, launcher

    cfg = (128, 128, 64, 8, 4, 4, "ws_pingpong")
    with pytest.raises(ValueError, match="interpreter"):
        _run_ag_mm(2, 0, 1, 128, 64, 128, False, True, cfg=cfg)
    monkeypatch.setattr(launcher, "interpreting", lambda: False)
    bf16 = torch.bfloat16
    assert ag_mm_ws.unsupported(1024, 1024, cfg, bf16) is None
    rows = knobs.codegen.AG_MM_WHOLE_ROWS
    assert "whole-input" in ag_mm_ws.unsupported(rows, rows, cfg, bf16, whole=ag_mm.reads_whole(rows))
    assert "contiguous" in ag_mm_ws.unsupported(1024, 512, cfg, bf16)
    assert "contiguous" in ag_mm_ws.unsupported(1000, 1000, cfg, bf16)
    assert "16-bit" in ag_mm_ws.unsupported(1024, 1024, cfg, torch.float32)
    assert "num_warps" in ag_mm_ws.unsupported(1024, 1024, cfg[:5] + (8, cfg[6]), bf16)
    assert "store field" in ag_mm_ws.unsupported(1024, 1024, cfg[:6] + ("tma_ws",), bf16)
    assert "store field" in ag_mm_ws.unsupported(1024, 1024, cfg[:6] + ("ws_pingpong_direct",), bf16)  # mm_rs's
    assert ag_mm_ws.unsupported(1024, 1024, (128, 256, 64, 8, 3, 4, "ws_coop"), bf16) is None
    # a warpgroup MMA's 64 rows: the cooperative form's two halves of a 64-row tile are 32 rows each
    assert "64" in ag_mm_ws.unsupported(1024, 1024, (64, 256, 64, 8, 3, 4, "ws_coop"), bf16)
    assert ag_mm_ws.unsupported(1024, 1024, (64, 256, 64, 8, 3, 4, "ws_pingpong"), bf16) is None
    for store in configs.GLUON_STORES:
        assert configs.store_variant(store)[0], "it stores by TMA: candidates only where tiles fit the chunks"


def test_moe_down_ws_refuses_what_it_does_not_do(monkeypatch):
    """The MoE down GEMM's Gluon forms run only what they implement: under the interpreter, weights whose experts
    are not stacked densely (half of a fused weight), K that a block would cross into the next expert at, outputs
    the TMA cannot store into or of another dtype, float32, other than 4 warps: an error (the op's tuning drops the
    config first, ``moe_gemm.down_unsupported``), never another kernel's result."""
    from overlap_backend.codegen import launcher, moe_down_ws, moe_gemm

    cfg = (128, 128, 64, 8, 4, 4, "ws_pingpong")
    bf16 = torch.bfloat16
    act, out, stage = torch.zeros(300, 512, dtype=bf16), torch.zeros(40, 1000, dtype=bf16), torch.zeros(90, 1000, dtype=bf16)
    w = torch.zeros(4, 512, 1000, dtype=bf16)
    assert "interpreter" in moe_gemm.down_unsupported(cfg, act, w, out, stage)
    assert moe_gemm.down_unsupported(cfg[:6] + (True,), act, w, out, stage) is None  # the tl kernel runs everything
    monkeypatch.setattr(launcher, "interpreting", lambda: False)
    assert moe_gemm.down_unsupported(cfg, act, w, out, stage) is None
    assert moe_gemm.down_unsupported((128, 256, 64, 8, 3, 4, "ws_coop"), act, w, out, stage) is None
    assert "64" in moe_gemm.down_unsupported((64, 256, 64, 8, 3, 4, "ws_coop"), act, w, out, stage)
    w_kmajor = torch.zeros(4, 1000, 512, dtype=bf16).transpose(1, 2)  # F.linear's layout per expert
    assert moe_down_ws.stacked_rows(w) == 4 * 512 and moe_down_ws.stacked_rows(w_kmajor) == 4 * 1000
    assert moe_down_ws.unsupported(cfg, act, w_kmajor, out, stage) is None
    half = torch.zeros(4, 512, 2000, dtype=bf16)[:, :, 1000:]  # one half of a fused weight
    assert moe_down_ws.stacked_rows(half) is None and "stacked" in moe_down_ws.unsupported(cfg, act, half, out, stage)
    odd = torch.zeros(4, 520, 1000, dtype=bf16)
    assert "multiple of BK" in moe_down_ws.unsupported(cfg, torch.zeros(300, 520, dtype=bf16), odd, out, stage)
    assert "dtype" in moe_down_ws.unsupported(cfg, act, w, out.float(), stage)
    assert "TMA" in moe_down_ws.unsupported(cfg, act, w, out[:, 1:], stage)
    assert "16-bit" in moe_down_ws.unsupported(cfg, act.float(), w.float(), out.float(), stage.float())
    assert "num_warps" in moe_down_ws.unsupported(cfg[:5] + (8, cfg[6]), act, w, out, stage)
    assert "store field" in moe_down_ws.unsupported(cfg[:6] + ("ws_pingpong_direct",), act, w, out, stage)
    with pytest.raises(ValueError, match="stacked"):
        moe_down_ws.launch(act, half, out, stage, {}, None, None, 1, 0, 2, 0, cfg, 1)


def test_cta_stage0_ws_refuses_what_it_does_not_do(monkeypatch):
    """CTA stage 0's Gluon forms run the GELU stages they implement and nothing else: under the interpreter, SwiGLU,
    the peer transport or pointer stores, split-K runs, chunks or a tail its tiles do not divide, float32, an unknown
    form: an error from ``launch_stage0``; ``stage0_form`` (the op's choice) takes the form asked for only on a GPU
    where it applies, and an unknown form is an error."""
    from overlap_backend.codegen import cta, cta_ws, launcher

    bf16 = torch.bfloat16
    x = torch.zeros(300, 512, dtype=bf16)
    ok = dict(act=cta.ACT_GELU_TANH, staged=True, tma_store=True, split_k=1, kchunk=512, fship=2048, block_m=128)
    assert "interpreter" in cta_ws.unsupported("ws_pingpong", x, 2048, **ok)
    with pytest.raises(ValueError, match="interpreter"):
        cta.launch_stage0(x, torch.zeros(512, 2048, dtype=bf16), None, None, None, torch.zeros(8, dtype=bf16), None,
                          None, None, None, None, 0, 512, 4, 0, 1, 1, cta.ACT_GELU, (128, 256, 64, 8, 3, 8), 1,
                          tma_store=True, form="ws_coop")
    monkeypatch.setattr(launcher, "interpreting", lambda: False)
    for form in cta_ws.FORMS:
        assert cta_ws.unsupported(form, x, 2048, **ok) is None
        assert cta_ws.config(form, (128, 256, 64, 8, 3, 8))[:4:3] == (128, 8), "the plan's row blocks and groups"
    assert "SwiGLU" in cta_ws.unsupported("ws_pingpong", x, 2048, **{**ok, "act": cta.ACT_SWIGLU})
    assert "copy-engine" in cta_ws.unsupported("ws_pingpong", x, 2048, **{**ok, "staged": False})
    assert "copy-engine" in cta_ws.unsupported("ws_pingpong", x, 2048, **{**ok, "tma_store": False})
    assert "split-K" in cta_ws.unsupported("ws_pingpong", x, 2048, **{**ok, "split_k": 2})
    assert "K-chunks" in cta_ws.unsupported("ws_coop", x, 2048, **{**ok, "kchunk": 384})  # 256-column tiles
    assert cta_ws.unsupported("ws_pingpong", x, 2048, **{**ok, "kchunk": 384}) is None  # 128-column tiles
    assert "tail" in cta_ws.unsupported("ws_coop", x, 2048, **{**ok, "fship": 1920})
    assert "16-bit" in cta_ws.unsupported("ws_coop", x.float(), 2048, **ok)
    assert "store field" in cta_ws.unsupported("tma_ws", x, 2048, **ok)
    # the few-rows plan's 64-row blocks: one warpgroup's MMA in the ping-pong form, half of one in the cooperative
    assert cta_ws.unsupported("ws_pingpong", x, 2048, **{**ok, "block_m": 64}) is None
    assert "64" in cta_ws.unsupported("ws_coop", x, 2048, **{**ok, "block_m": 64})
    assert cta.stage0_form("ws_coop", x, 2048, cta.ACT_GELU, True, True, 1, 512, 2048, 128) is None, "a CPU tensor"
    with pytest.raises(ValueError, match="ws_coop"):
        cta.stage0_form("coop", x, 2048, cta.ACT_GELU, True, True, 1, 512, 2048, 128)


def test_moe_down_tunes_over_a_measured_variant():
    """The MoE down GEMM's candidates take the kernel benchmark's fastest variant near the shape (its Gluon forms
    are bench variants), once; the gate/up GEMM's and the knob's candidates stay as they are."""
    from overlap_backend.codegen import moe_gemm

    base = moe_gemm.candidates(torch.bfloat16, "down")
    assert base == list(knobs.codegen.MOE_DOWN_16BIT)
    ws_coop = (128, 256, 64, 8, 3, 4, "ws_coop")
    assert moe_gemm.candidates(torch.bfloat16, "down", ws_coop) == base + [ws_coop]
    assert moe_gemm.candidates(torch.bfloat16, "down", list(base[0])) == base
    assert ws_coop in knobs.codegen.VARIANTS_16BIT["moe_down"]


def test_ag_mm_ws_epilogue_pieces_hold_the_knobs_values_per_thread():
    """The Gluon kernel runs a generated epilogue on pieces of its tile in shared memory, ``GLUON_EPILOGUE_VALUES``
    values per thread of the partition's warpgroup each: whole rows of one swizzle atom's column block (the tile lies
    in memory as its column blocks one after another), at least the 16 rows its load layout covers, at most the
    block; on the registers without an epilogue, for an output of another dtype (the pieces' store rounds to the
    output's dtype, the epilogue to the GEMM's) and with the knob 0."""
    from triton.experimental.gluon import language as gl

    from overlap_backend.codegen import ag_mm_ws
    from overlap_backend.codegen import epilogue as gen
    from overlap_backend.codegen import gluon_ring

    g, bf16 = gen.build("bias:0,gelu", torch.bfloat16), torch.bfloat16
    with knobs.codegen.patch(GLUON_EPILOGUE_VALUES=16):
        assert ag_mm_ws.epilogue_values_of(g, bf16, bf16) == 16
        assert ag_mm_ws.epilogue_values_of(None, bf16, bf16) == 0
        assert ag_mm_ws.epilogue_values_of(g, bf16, torch.float32) == 0
    with knobs.codegen.patch(GLUON_EPILOGUE_VALUES=0):
        assert ag_mm_ws.epilogue_values_of(g, bf16, bf16) == 0
    # a warpgroup's tile: ping-pong 128 x 128, cooperative 64 of 128 x 256 rows; bf16 (128-byte swizzle: 64 columns)
    for rows, BN in ((128, 128), (64, 256), (128, 64)):
        layout = gluon_ring.smem_layout([rows, BN], gl.bfloat16)
        cols = gluon_ring.piece_cols(layout, 16)
        assert cols == 64
        assert gluon_ring.piece_rows(rows, cols, 16) == 32  # 16 values x 128 threads / 64 columns
        assert gluon_ring.piece_rows(rows, cols, 8) == 16
        assert gluon_ring.piece_rows(rows, cols, 1024) == rows
        assert rows % gluon_ring.piece_rows(rows, cols, 16) == 0 and BN % cols == 0
    # narrower tiles swizzle less: a 32-column bf16 tile's atom is its whole row
    assert gluon_ring.piece_cols(gluon_ring.smem_layout([128, 32], gl.bfloat16), 16) == 32
