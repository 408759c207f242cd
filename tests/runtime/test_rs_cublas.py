"""``mm_rs``'s cuBLAS path (``runtime/symm/mm_rs.py: mm_rs_cublas``) on CPU: every rank in a thread, the
real ``GroupState.begin`` / ``push`` / ``end``, with the driver's stream memory operations done at
once (a write sets the word, a wait blocks the thread until the word is reached, a copy is a
``memmove`` into the peer's receive tensor). Checks the data path (chunk rows, bands, push offsets,
flag indices, the reduction) against the float32 reduce-scatter; the flag protocol under every
stream interleaving is ``test_graph_flags.py``'s."""

from __future__ import annotations

import contextlib
import ctypes
import math
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from overlap_backend.runtime import cuda as _cuda
from overlap_backend.runtime.symm import ag_mm as symm_ag_mm
from overlap_backend.runtime.symm import group
from overlap_backend.runtime.symm import mm_ar as symm_mm_ar
from overlap_backend.runtime.symm import mm_rs as symm_mm_rs
from overlap_backend.spec import knobs, symm_layout

SPAN = 1 << 24  # fake flag buffer address of rank p: p * SPAN


class Memory:
    """Every rank's flag words; waits block (bounded) until another thread writes."""

    def __init__(self, ws: int):
        self.words = [{symm_layout.PEER_OK: 1} for _ in range(ws)]
        self.cond = threading.Condition()

    def write_value32(self, addr, value, stream):
        with self.cond:
            self.words[addr // SPAN][(addr % SPAN) // 4] = value
            self.cond.notify_all()

    def wait_value32(self, addr, value, stream):
        rank, word = addr // SPAN, (addr % SPAN) // 4
        with self.cond:
            if not self.cond.wait_for(lambda: self.words[rank].get(word, 0) >= value, timeout=30):
                raise TimeoutError(f"rank {rank} word {word} never reached {value}")

    @staticmethod
    def memcpy_async(dst, src, nbytes, stream):
        ctypes.memmove(dst, src, nbytes)


class Stream:
    def wait_stream(self, other) -> None:
        pass


@pytest.fixture
def symm_knobs():
    """``symm_knobs(NAME=value, ...)``: ``knobs.symm`` patched until the test ends."""
    with contextlib.ExitStack() as stack:
        yield lambda **values: stack.enter_context(knobs.symm.patch(**values))


def states(ws: int, recvs, monkeypatch):
    """Every rank's GroupState on ``Memory`` (a test that spreads the pushes over per-peer streams
    patches knobs.symm.PUSH_STREAM_PER_PEER)."""
    mem = Memory(ws)
    monkeypatch.setattr(group, "comm_stream", lambda index, slot: Stream())
    for name in ("write_value32", "wait_value32", "memcpy_async"):
        monkeypatch.setattr(_cuda, name, getattr(mem, name))
    local = threading.local()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: local.compute)
    out = []
    for r in range(ws):
        st = group.GroupState.host_only(r, ws)
        st.flags = SimpleNamespace(ptrs=[p * SPAN for p in range(ws)])
        st.data = SimpleNamespace(ptrs=[t.data_ptr() for t in recvs])
        st.push_stream, st.copy_stream, st.device = Stream(), Stream(), SimpleNamespace(index=r)
        st._progress = lambda word, compute: None  # the watchdog's status words: not modelled
        out.append(st)
    return out, local


def run_ranks(ws, calls, local):
    """``calls[r]()`` in one thread per rank; returns their results, re-raising any error."""
    results, errors = [None] * ws, []

    def body(r):
        local.compute = Stream()
        try:
            results[r] = calls[r]()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(ws)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank is stuck"
    if errors:
        raise errors[0]
    return results


def many_bands(symm_knobs):
    """Bands of 16 rows and up (the tests' GEMMs are tiny), so that chunks have several."""
    symm_knobs(RS_CUBLAS_BAND_FLOPS=0, BAND_ROWS_MIN=16)


CASES = [  # ws, outer, run, bias, reduce_op, dtype
    (2, 1, 1200, False, "sum", torch.float32),  # eight bands of one run (addmm path)
    (2, 1, 40, False, "avg", torch.float32),  # two bands
    (2, 3, 16, False, "sum", torch.bfloat16),  # a band per run
    (2, 2, 24, True, "sum", torch.float32),  # bias: the summing kernel path
    (3, 1, 600, False, "sum", torch.float32),
    (4, 10, 8, True, "avg", torch.float32),  # several runs per band
    (2, 1, 0, False, "sum", torch.float32),  # empty chunks: one empty band
]


@pytest.mark.parametrize("one_band", [False, True], ids=["bands", "one_band"])
@pytest.mark.parametrize("ws,outer,run,bias,reduce_op,dtype", CASES)
def test_cublas_path_matches_the_float32_reduce_scatter(ws, outer, run, bias, reduce_op, dtype, one_band, monkeypatch,
                                                        symm_knobs):
    """Both orders of the own bands (a chunk of one band computes its own partial first)."""
    torch.manual_seed(ws * 100 + outer * 10 + run)
    many_bands(symm_knobs)
    if one_band:
        symm_knobs(RS_CUBLAS_BAND_FLOPS=1e18)
        assert len(symm_mm_rs.rs_cublas_bands(outer, run, 24, 40)) == 1
    K, N = 24, 40
    rows = outer * run
    a = [torch.randn(outer * ws * run, K, dtype=dtype) for _ in range(ws)]
    b = [torch.randn(K, N, dtype=dtype) for _ in range(ws)]
    c = [torch.randn(N, dtype=dtype) if bias else None for _ in range(ws)]
    recvs = [torch.full((ws * rows, N), float("nan"), dtype=dtype) for _ in range(ws)]  # poisoned
    sts, local = states(ws, recvs, monkeypatch)
    outs = run_ranks(ws, [lambda r=r: symm_mm_rs.mm_rs_cublas(sts[r], a[r], b[r], c[r], recvs[r], outer, run,
                                                                  reduce_op == "avg", graph=False)
                          for r in range(ws)], local)
    full = sum(a[r].float() @ b[r].float() + (c[r].float() if bias else 0) for r in range(ws))
    if reduce_op == "avg":
        full = full / ws
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    for r in range(ws):
        want = full.view(outer, ws, run, N)[:, r].reshape(rows, N)
        assert outs[r].shape == (rows, N) and outs[r].dtype == dtype
        if not rows:
            continue
        err = ((outs[r].float() - want).norm() / want.norm()).item()
        assert err < tol, (r, err)
        assert sts[r].epoch == 1 and {p for p, _ in sts[r]._ready_waited} == {p for p in range(ws) if p != r}


@pytest.mark.parametrize("merge_rows", [0, 64], ids=["per_chunk", "merged"])
@pytest.mark.parametrize("ws", [3, 4])
def test_short_chunks_take_one_gemm_per_range_of_the_peers(ws, merge_rows, monkeypatch, symm_knobs):
    """knobs.symm.RS_CUBLAS_MERGE_ROWS: chunks shorter than it are computed in one GEMM per contiguous range of
    the peers' chunks (after the rank's own, then before it) and the own chunk's; the result is the
    reduce-scatter's, on every rank (first, middle and last: one range or two)."""
    torch.manual_seed(ws + merge_rows)
    symm_knobs(RS_CUBLAS_MERGE_ROWS=merge_rows)
    outer, run, K, N = 1, 40, 24, 40
    a = [torch.randn(ws * run, K) for _ in range(ws)]
    b = [torch.randn(K, N) for _ in range(ws)]
    recvs = [torch.full((ws * run, N), float("nan")) for _ in range(ws)]
    sts, local = states(ws, recvs, monkeypatch)
    real, gemms = symm_mm_rs.matmul_into, {}

    def counted(x, w, bias, out):
        gemms.setdefault(threading.get_ident(), []).append(x.shape[0])
        return real(x, w, bias, out)

    monkeypatch.setattr(symm_mm_rs, "matmul_into", counted)
    idents = [None] * ws

    def call(r):
        idents[r] = threading.get_ident()
        return symm_mm_rs.mm_rs_cublas(sts[r], a[r], b[r], None, recvs[r], outer, run, False, graph=False)

    outs = run_ranks(ws, [lambda r=r: call(r) for r in range(ws)], local)
    full = sum(a[r].double() @ b[r].double() for r in range(ws))
    for r in range(ws):
        torch.testing.assert_close(outs[r].double(), full[r * run:(r + 1) * run], rtol=1e-4, atol=1e-4)
        rows = gemms[idents[r]]
        assert sum(rows) == ws * run, rows
        if merge_rows:
            assert rows[:-1] == [n * run for n in (ws - 1 - r, r) if n] and rows[-1] == run, (r, rows)
        else:
            assert rows == [run] * ws, (r, rows)


@pytest.mark.parametrize("ws,outer,run", [(3, 1, 600), (4, 10, 8)])
def test_cublas_path_with_a_push_stream_per_peer(ws, outer, run, monkeypatch, symm_knobs):
    """knobs.symm.PUSH_STREAM_PER_PEER: each peer's partials go on a stream of its own, whose READY wait
    and done-flag waits precede them there; the result is the reduce-scatter's."""
    torch.manual_seed(ws)
    many_bands(symm_knobs)
    symm_knobs(PUSH_STREAM_PER_PEER=True)
    K, N = 24, 40
    rows = outer * run
    a = [torch.randn(outer * ws * run, K) for _ in range(ws)]
    b = [torch.randn(K, N) for _ in range(ws)]
    recvs = [torch.full((ws * rows, N), float("nan")) for _ in range(ws)]
    sts, local = states(ws, recvs, monkeypatch)
    outs = run_ranks(ws, [lambda r=r: symm_mm_rs.mm_rs_cublas(sts[r], a[r], b[r], None, recvs[r], outer, run,
                                                                  False, graph=False) for r in range(ws)], local)
    full = sum(a[r].double() @ b[r].double() for r in range(ws))
    for r in range(ws):
        want = full.view(outer, ws, run, N)[:, r].reshape(rows, N)
        torch.testing.assert_close(outs[r].double(), want, rtol=1e-4, atol=1e-4)
        waited = sts[r]._ready_waited
        assert len({s for _, s in waited}) == ws - 1 and {p for p, _ in waited} == {p for p in range(ws) if p != r}


def test_a_band_pushed_at_the_wrong_offset_is_caught(monkeypatch, symm_knobs):
    """The check can fail: with every push shifted by one row the reduction reads poison."""
    many_bands(symm_knobs)
    ws, outer, run, K, N = 2, 1, 600, 8, 16
    real_push = group.GroupState.push
    monkeypatch.setattr(group.GroupState, "push", lambda self, peer, dst, src, n, flag, stream=None: real_push(
        self, peer, dst + 4 * N if n else dst, src, max(0, n - 4 * N), flag, stream))
    a = [torch.randn(ws * run, K) for _ in range(ws)]
    b = [torch.randn(K, N) for _ in range(ws)]
    recvs = [torch.full((ws * run, N), float("nan")) for _ in range(ws)]
    sts, local = states(ws, recvs, monkeypatch)
    outs = run_ranks(ws, [lambda r=r: symm_mm_rs.mm_rs_cublas(sts[r], a[r], b[r], None, recvs[r], outer, run,
                                                                  False, graph=False) for r in range(ws)], local)
    assert all(torch.isnan(o).any() for o in outs)


def test_captured_calls_take_their_own_band_floor(symm_knobs):
    """RS_CUBLAS_BAND_FLOPS_CAPTURED: unset, a captured call cuts its chunks like an eager one; set,
    only captured calls take it (no host time per band there), eager calls keep RS_CUBLAS_BAND_FLOPS."""
    shape = (1, 2048, 1792, 8192)  # mm_rs M=8192, K=7168 at 4 GPUs: 60 GFLOP per chunk
    symm_knobs(RS_CUBLAS_BAND_FLOPS=64e9)
    eager = symm_mm_rs.rs_cublas_bands(*shape)
    assert len(eager) == 1 and symm_mm_rs.rs_cublas_bands(*shape, captured=True) == eager
    symm_knobs(RS_CUBLAS_BAND_FLOPS_CAPTURED=0.0)
    captured = symm_mm_rs.rs_cublas_bands(*shape, captured=True)
    assert [n for (band,) in captured for _, _, n in [band]] == [knobs.symm.BAND_ROWS_MIN] * 4  # bands of 512 rows
    assert symm_mm_rs.rs_cublas_bands(*shape) == eager


@pytest.mark.parametrize("ws", [2, 4])
def test_captured_bands_match_the_float32_reduce_scatter(ws, monkeypatch, symm_knobs):
    """A call priced as captured (``graph=True``: the flag block for replays) with the finer captured
    bands gives the reduce-scatter's result, and every rank cuts its chunks alike."""
    torch.manual_seed(ws)
    symm_knobs(RS_CUBLAS_BAND_FLOPS=1e18, RS_CUBLAS_BAND_FLOPS_CAPTURED=0.0, BAND_ROWS_MIN=4)
    outer, run, K, N = 1, 12, 24, 40
    assert len(symm_mm_rs.rs_cublas_bands(outer, run, K, N, captured=True)) == 3
    cut, seen = symm_mm_rs.rs_cublas_bands, []
    monkeypatch.setattr(symm_mm_rs, "rs_cublas_bands", lambda *a, **kw: seen.append(cut(*a, **kw)) or seen[-1])
    a = [torch.randn(outer * ws * run, K) for _ in range(ws)]
    b = [torch.randn(K, N) for _ in range(ws)]
    recvs = [torch.full((ws * outer * run, N), float("nan")) for _ in range(ws)]
    sts, local = states(ws, recvs, monkeypatch)
    for st in sts:  # a replay's status counts and its flag reset (a kernel on the compute stream): not modelled
        st._count_replay = lambda word, compute: None
        st._zero_graph_flags = lambda compute: None
    outs = run_ranks(ws, [lambda r=r: symm_mm_rs.mm_rs_cublas(sts[r], a[r], b[r], None, recvs[r], outer, run,
                                                                  False, graph=True) for r in range(ws)], local)
    assert [len(bands) for bands in seen] == [3] * ws  # the captured call cut its chunks finer
    full = sum(a[r].double() @ b[r].double() for r in range(ws))
    for r in range(ws):
        torch.testing.assert_close(outs[r].double(), full[r * run : (r + 1) * run], rtol=1e-4, atol=1e-4)


def test_bands_cover_each_chunk_once_in_local_row_order():
    for outer, run, K, N in [(1, 1, 64, 64), (1, 0, 64, 64), (1, 5000, 64, 64), (1, 2048, 3584, 8192),
                             (1, 8192, 1024, 8192), (3, 700, 4096, 4096), (8, 64, 64, 64), (17, 32, 8192, 8192),
                             (64, 128, 4096, 4096)]:
        bands = symm_mm_rs.rs_cublas_bands(outer, run, K, N)
        assert 1 <= len(bands) <= symm_layout.MAX_BANDS
        flops = [2 * K * N * sum(p[2] for p in band) for band in bands]
        if len(bands) > 1:  # bands are only cut where each keeps enough GEMM work for its host time
            assert min(flops) >= knobs.symm.RS_CUBLAS_BAND_FLOPS / 2, (outer, run, K, N, flops)
        local_rows = [o * run + j + i for band in bands for o, j, n in band for i in range(n)]
        assert local_rows == list(range(outer * run)), (outer, run)
        for band in bands:  # a band's pieces are consecutive local rows (pushed as one copy)
            firsts = [o * run + j for o, j, n in band]
            assert all(f == firsts[0] + sum(p[2] for p in band[:i]) for i, f in enumerate(firsts))


def test_rs_gemm_decision(symm_knobs):
    """Where each path measured faster (knobs.symm.MM_RS_GEMM's comment)."""
    assert symm_mm_rs.rs_gemm(1, 2048, 3584) == "cublas"  # M=4096 K=7168 on 2 GPUs
    assert symm_mm_rs.rs_gemm(4, 1024, 2048) == "cublas"  # runs of 1024 rows: a GEMM per run
    assert symm_mm_rs.rs_gemm(1, 8192, 1024) == "triton"  # short K: the transfer dominates
    assert symm_mm_rs.rs_gemm(1, 256, 3584) == "triton"  # decode size
    assert symm_mm_rs.rs_gemm(16, 64, 4096) == "triton"  # many short runs: the kernel's row map
    assert symm_mm_rs.rs_gemm(1, 4096, 4096, transport="peer") == "triton"  # peer stores come from the kernel
    symm_knobs(MM_RS_GEMM="triton")
    assert symm_mm_rs.rs_gemm(1, 4096, 4096) == "triton"


def test_captured_calls_take_the_path_of_their_eager_warm_up(symm_knobs):
    """Captured calls ship by copy engine whatever TRANSPORT says; otherwise the same rule, so a
    capture finds what its eager warm-up set up (a cuBLAS warm-up tunes no kernel config)."""
    symm_knobs(TRANSPORT="peer")
    assert symm_mm_rs.rs_gemm(1, 2048, 3584) == "triton"
    assert symm_mm_rs.rs_gemm(1, 2048, 3584, "ce") == "cublas"


@pytest.mark.parametrize("ws,bias", [(2, False), (4, True)])
def test_runtime_call_listing_follows_the_cublas_path(ws, bias, monkeypatch, symm_knobs):
    """The debug dump's listing (runtime/plan.py) of a call that takes the cuBLAS path: Python that
    parses, one GEMM per run and chunk, the reduction the path uses."""
    from overlap_backend.runtime import plan

    monkeypatch.setattr(symm_mm_rs, "mm_problem", lambda *a: None)  # meta tensors stand for CUDA ones
    many_bands(symm_knobs)  # a band per run
    bf16 = dict(device="meta", dtype=torch.bfloat16)
    args = {"a": torch.empty(4 * 2048, 2048, **bf16), "b": torch.empty(2048, 1024, **bf16),
            "bias": torch.empty(1024, **bf16) if bias else None, "out_shape": [4, 2048, 1024], "scatter_dim": 1,
            "reduce_op": "sum", "group_name": "g", "lowering": "symm", "epilogue": ""}
    listing = plan.render("mm_rs", args, 1, ws)
    compile(listing, "mm_rs.py", "exec")
    assert "mm_rs on cuBLAS" in listing and "mm_rs_kernel" not in listing
    assert listing.count("cuBLAS (bias if any)") == 4 * (ws - 1)  # remote chunks: a GEMM per run
    assert listing.count("flags.DONE[") == 2 * 4 * (ws - 1)  # raised on compute, awaited on push
    # several bands: each own band waits first; at ws 2 without bias addmm adds the peer's partial
    assert ("torch.addmm(recv[" in listing) == (ws == 2 and not bias)
    assert (".sum(0)" in listing) == (ws > 2 or bias)
    # one band (the default floor of GEMM work per band: the four runs are one band): the listing
    # has every own GEMM before the first wait for a peer's partial, then the sums
    symm_knobs(RS_CUBLAS_BAND_FLOPS=64e9)
    one_band = plan.render("mm_rs", args, 1, ws)
    compile(one_band, "mm_rs.py", "exec")
    assert "1 band(s) each" in one_band
    lines = one_band.splitlines()
    own = [k for k, ln in enumerate(lines) if ln.strip().startswith("recv[1, ") and "@ b" in ln]  # rank 1's
    first_wait = min(k for k, ln in enumerate(lines) if "RS_ARRIVED" in ln and "stream=compute" in ln)
    assert len(own) == 4 and max(own) < first_wait
    assert "torch.addmm(" not in one_band and one_band.count(".sum(0)") == 4
    assert "mm_rs on cuBLAS" in plan.render("mm_rs", args, 1, ws, captured=True)  # captured: the same path
    symm_knobs(MM_RS_GEMM="triton")
    assert "mm_rs_kernel" in plan.render("mm_rs", args, 1, ws)


AR_CASES = [  # ws, M, bias, reduce_op, rounds
    (2, 1000, False, "sum", 3),  # addmm path; the last round's chunks partly empty
    (2, 64, True, "avg", 1),
    (3, 301, False, "sum", 2),
    (4, 90, True, "sum", 4),  # fewer rows than chunks in the last round
]


@pytest.mark.parametrize("ws,M,bias,reduce_op,rounds", AR_CASES)
def test_mm_ar_cublas_path_matches_the_float32_all_reduce(ws, M, bias, reduce_op, rounds, monkeypatch):
    """``_mm_ar_cublas`` on every rank (threads): rounds of reduce-scatter, then each reduced chunk
    pushed to every peer's gather region and copied out; every row of every rank's result checked."""
    torch.manual_seed(ws * 1000 + M)
    monkeypatch.setattr(symm_mm_ar, "ar_cublas_rounds", lambda *a: rounds)
    K, N = 16, 24
    a = [torch.randn(M, K) for _ in range(ws)]
    b = [torch.randn(K, N) for _ in range(ws)]
    c = [torch.randn(N) if bias else None for _ in range(ws)]
    rows = -(-M // (rounds * ws))
    data = [torch.full((2 * rounds * ws * rows * N,), float("nan")) for _ in range(ws)]  # recv + gather, poisoned
    sts, local = states(ws, data, monkeypatch)
    for st, d in zip(sts, data):
        st.ensure_data = lambda nbytes, op="", d=d: None if nbytes <= d.numel() * 4 else pytest.fail("data buffer too small")
        st.data_view = lambda dtype, shape, offset=0, d=d: d.view(torch.uint8)[offset:].view(dtype)[
            : math.prod(shape)].view(shape)
    outs = run_ranks(ws, [lambda r=r: symm_mm_ar.mm_ar_cublas(sts[r], a[r], b[r], c[r], reduce_op == "avg")
                          for r in range(ws)], local)
    want = sum(a[r] @ b[r] + (c[r] if bias else 0) for r in range(ws))
    if reduce_op == "avg":
        want = want / ws
    for r in range(ws):
        assert outs[r].shape == (M, N) and not torch.isnan(outs[r]).any(), r
        torch.testing.assert_close(outs[r], want, rtol=1e-4, atol=1e-4)


def test_mm_ar_listing_follows_the_cublas_path(monkeypatch):
    from overlap_backend.runtime import plan

    monkeypatch.setattr(symm_mm_rs, "mm_problem", lambda *a: None)  # meta tensors stand for CUDA ones
    bf16 = dict(device="meta", dtype=torch.bfloat16)
    args = {"a": torch.empty(1536, 7168, **bf16), "b": torch.empty(7168, 8192, **bf16), "bias": None,
            "reduce_op": "sum", "group_name": "g", "lowering": "symm", "epilogue": ""}
    monkeypatch.setattr(symm_mm_ar, "ar_cublas_rounds", lambda *a: 2)  # the listing follows any round count
    listing = plan.render("mm_ar", args, 0, 2)
    compile(listing, "mm_ar.py", "exec")
    assert "mm_ar on cuBLAS" in listing and listing.count(".sum(0)") == 2 and "torch.addmm(" not in listing
    assert "mm_ar on cuBLAS" in plan.render("mm_ar", args, 0, 2, captured=True)  # captured: the same path
    args["a"] = torch.empty(8192, 7168, **bf16)  # the kernel's four rounds measured faster
    assert "mm_rs_kernel" in plan.render("mm_ar", args, 0, 2)


def test_ar_gemm_decision():
    assert symm_mm_ar.ar_gemm(1024, 7168, 2) == "cublas"  # one round: cuBLAS's lower host time
    assert symm_mm_ar.ar_gemm(4096, 7168, 2) == "triton"  # rounds: the kernel hides the all-gather
    assert symm_mm_ar.ar_gemm(1024, 1024, 2) == "triton"  # short K


EPILOGUE_CASES = [  # ws, outer, run, bias, reduce_op, dtype, spec
    (2, 1, 40, False, "sum", torch.float32, "add:0"),  # ws 2 without bias: mm + the reducing kernel, not addmm
    (2, 3, 16, True, "avg", torch.bfloat16, "add:0,gelu"),
    (3, 2, 24, False, "sum", torch.float32, "bias:1,mul:0.5,add:0"),
    (4, 1, 48, True, "sum", torch.float16, "silu,cast:float32"),  # the output's dtype is the cast's
]


@pytest.mark.parametrize("ws,outer,run,bias,reduce_op,dtype,spec", EPILOGUE_CASES)
def test_cublas_path_applies_a_generated_epilogue_in_its_reduction(ws, outer, run, bias, reduce_op, dtype, spec,
                                                                   monkeypatch, symm_knobs):
    """A captured epilogue stays on the cuBLAS path and runs in the generated ``reduce_kernel``
    (under ``TRITON_INTERPRET=1``), band by band, with rows numbered as the op's output (the
    residual of ``add`` is read at the right rows): against the float32 reduce-scatter followed by
    the reference epilogue (spec/epilogue.py) on the rounded result."""
    from overlap_backend.codegen import epilogue as gen
    from overlap_backend.spec import epilogue as spec_mod

    torch.manual_seed(ws * 100 + outer * 10 + run)
    many_bands(symm_knobs)
    lock = threading.Lock()  # the interpreter is not thread-safe: one rank's kernel at a time
    real = gen.apply_reduce
    monkeypatch.setattr(gen, "apply_reduce", lambda *a, **k: (lock.acquire(), real(*a, **k), lock.release())[1])
    g = gen.build(spec, dtype)
    K, N = 24, 40
    rows = outer * run
    a = [torch.randn(outer * ws * run, K, dtype=dtype) for _ in range(ws)]
    b = [torch.randn(K, N, dtype=dtype) for _ in range(ws)]
    c = [torch.randn(N, dtype=dtype) if bias else None for _ in range(ws)]
    eargs = [[torch.randn(rows, N, dtype=dtype), torch.randn(N, dtype=dtype)] for _ in range(ws)]
    recvs = [torch.full((ws * rows, N), float("nan"), dtype=dtype) for _ in range(ws)]  # poisoned
    sts, local = states(ws, recvs, monkeypatch)
    outs = run_ranks(ws, [lambda r=r: symm_mm_rs.mm_rs_cublas(sts[r], a[r], b[r], c[r], recvs[r], outer, run,
                                                                  reduce_op == "avg", False, g, eargs[r])
                          for r in range(ws)], local)
    full = sum(a[r].float() @ b[r].float() + (c[r].float() if bias else 0) for r in range(ws))
    if reduce_op == "avg":
        full = full / ws
    tol = 2e-2 if dtype != torch.float32 else 1e-4
    for r in range(ws):
        reduced = full.view(outer, ws, run, N)[:, r].reshape(rows, N).to(dtype)
        want = spec_mod.apply(spec, reduced, eargs[r]).float()
        assert outs[r].dtype == spec_mod.out_dtype(spec, dtype) and outs[r].shape == (rows, N)
        err = ((outs[r].float() - want).norm() / want.norm()).item()
        assert err < tol, (r, err)
    # the check can fail: the residual read at the rows of the chunk instead of the op's output
    if "add:0" in spec and outer * run > 16:
        shifted = spec_mod.apply(spec, full.view(outer, ws, run, N)[:, 0].reshape(rows, N).to(dtype),
                                 [eargs[0][0].roll(16, 0), eargs[0][1]]).float()
        assert ((outs[0].float() - shifted).norm() / shifted.norm()).item() > tol


@pytest.mark.parametrize("ws", [2, 4])
def test_a_captured_epilogue_keeps_mm_rs_on_cublas(ws, monkeypatch, symm_knobs):
    """Fused epilogues no longer move a chunk from cuBLAS to the slower Triton kernel (the path
    depends on shapes only): the listing reduces every band in the generated reduce_kernel, at
    ws 2 too."""
    from overlap_backend.runtime import plan

    monkeypatch.setattr(symm_mm_rs, "mm_problem", lambda *a: None)  # meta tensors stand for CUDA ones
    many_bands(symm_knobs)  # a band per run
    bf16 = dict(device="meta", dtype=torch.bfloat16)
    args = {"a": torch.empty(4 * 2048, 2048, **bf16), "b": torch.empty(2048, 1024, **bf16), "bias": None,
            "out_shape": [4, 2048, 1024], "scatter_dim": 1, "reduce_op": "sum", "group_name": "g",
            "lowering": "symm", "epilogue": "add:0"}
    listing = plan.render("mm_rs", args, 0, ws)
    compile(listing, "mm_rs.py", "exec")
    assert "mm_rs on cuBLAS" in listing and "mm_rs_kernel" not in listing
    assert listing.count("launch(reduce_kernel_0") == 4 and "torch.addmm(" not in listing
    assert ".sum(0)" not in listing and "pointwise_kernel_0" not in listing


@pytest.mark.parametrize("one_band", [True, False])
def test_own_partial_before_the_wait_only_for_one_band(one_band, monkeypatch, symm_knobs):
    """The own partial first in the runtime (not only the listing): with one band the own partial's GEMM is
    enqueued on the compute stream before its wait for the peer's partial; with several bands each
    own band waits first (and at ws 2 without bias reduces in addmm)."""
    ws, outer, run, K, N = 2, 1, 64, 8, 16
    many_bands(symm_knobs)
    if one_band:
        symm_knobs(RS_CUBLAS_BAND_FLOPS=1e18)
    a = [torch.randn(ws * run, K) for _ in range(ws)]
    b = [torch.randn(K, N) for _ in range(ws)]
    recvs = [torch.full((ws * run, N), float("nan")) for _ in range(ws)]
    sts, local = states(ws, recvs, monkeypatch)
    events = {r: [] for r in range(ws)}
    real_mm, real_wait, real_addmm = symm_mm_rs.matmul_into, _cuda.wait_value32, torch.addmm

    def rank_of_thread():
        return next(r for r in range(ws) if local.compute is streams[r])

    streams = {}

    def mm(x, w, bias, out):
        r = rank_of_thread()
        if out.data_ptr() >= recvs[r].data_ptr() and out.data_ptr() < recvs[r].data_ptr() + recvs[r].nbytes:
            events[r].append("own mm")
        return real_mm(x, w, bias, out)

    def wait(addr, value, stream):
        if stream is local.compute:
            events[rank_of_thread()].append("wait")
        return real_wait(addr, value, stream)

    def addmm(*args, **kw):
        events[rank_of_thread()].append("own addmm")
        return real_addmm(*args, **kw)

    monkeypatch.setattr(symm_mm_rs, "matmul_into", mm)
    monkeypatch.setattr(_cuda, "wait_value32", wait)
    monkeypatch.setattr(torch, "addmm", addmm)

    def call(r):
        streams[r] = local.compute
        return symm_mm_rs.mm_rs_cublas(sts[r], a[r], b[r], None, recvs[r], outer, run, False, graph=False)

    outs = run_ranks(ws, [lambda r=r: call(r) for r in range(ws)], local)
    for r in range(ws):
        want = sum(a[q] @ b[q] for q in range(ws)).view(ws, run, N)[r]
        torch.testing.assert_close(outs[r], want, rtol=1e-4, atol=1e-4)
        seq = events[r]
        if one_band:
            assert seq.index("own mm") < seq.index("wait") and "own addmm" not in seq, seq
        else:
            assert "own mm" not in seq and seq.index("wait") < seq.index("own addmm"), seq


# ------------------------------------------------------------------------------ ag_mm on cuBLAS
AG_CASES = [  # ws, outer, run, bias, weights, dtype
    (2, 1, 40, False, 1, torch.float32),
    (2, 1, 1200, True, 2, torch.float32),  # several bands per chunk: the chunk's last band is awaited
    (3, 1, 24, False, 2, torch.bfloat16),
    (4, 3, 16, True, 1, torch.float32),  # gathered along an inner dim: one GEMM per (outer index, chunk)
    (4, 2, 8, False, 3, torch.float32),
]


@pytest.mark.parametrize("ws,outer,run,bias,n_weights,dtype", AG_CASES)
def test_ag_cublas_path_matches_the_float32_gather_then_matmul(ws, outer, run, bias, n_weights, dtype, monkeypatch,
                                                               symm_knobs):
    """``push_shard`` + ``ag_mm_cublas`` (what ``ag_mm`` runs with ``AG_MM_GEMM = "cublas"``) on
    every rank: each output is the float32 all-gather (rows in the gathered order) times its weight;
    the receive buffers start poisoned, so a chunk read before its push or from the wrong slot shows."""
    torch.manual_seed(ws * 100 + outer * 10 + run)
    symm_knobs(BAND_ROWS_MIN=16)
    K = 24
    rows = outer * run
    shards = [torch.randn(outer, run, K, dtype=dtype) for _ in range(ws)]
    weights = [torch.randn(K, 8 * (i + 2), dtype=dtype) for i in range(n_weights)]
    biases = [torch.randn(w.shape[1], dtype=dtype) if bias else None for w in weights]
    recvs = [torch.full((ws * rows, K), float("nan"), dtype=dtype) for _ in range(ws)]  # poisoned
    sts, local = states(ws, recvs, monkeypatch)
    copy = _cuda.memcpy_async
    slow = shards[1].data_ptr(), shards[1].data_ptr() + shards[1].numel() * shards[1].element_size()

    def late_copy(dst, src, nbytes, stream):  # rank 1's pushes land late: a GEMM that does not wait reads poison
        if slow[0] <= src < slow[1]:
            time.sleep(0.1)
        copy(dst, src, nbytes, stream)

    monkeypatch.setattr(_cuda, "memcpy_async", late_copy)

    def call(r):
        st = sts[r]
        epoch = st.begin(torch.cuda.current_stream())
        nb = symm_ag_mm.push_shard(st, shards[r].view(rows, K))
        outs = [torch.full((ws * rows, w.shape[1]), float("nan"), dtype=dtype) for w in weights]
        symm_ag_mm.ag_mm_cublas(st, shards[r].view(rows, K), recvs[r].view(ws, rows, K), weights, biases, outs,
                                outer, run, epoch, 0, nb, torch.cuda.current_stream())
        st.end(torch.cuda.current_stream())
        return outs

    monkeypatch.setattr(group.GroupState, "_progress", lambda self, word, compute: None, raising=False)
    results = run_ranks(ws, [lambda r=r: call(r) for r in range(ws)], local)
    gathered = torch.cat([s.float() for s in shards], dim=1).reshape(outer * ws * run, K)  # [outer, ws*run, K]
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    for r in range(ws):
        for w, b, out in zip(weights, biases, results[r]):
            want = gathered @ w.float() + (b.float() if bias else 0)
            err = ((out.float() - want).norm() / want.norm()).item()
            assert err < tol, (r, err)


def test_ag_gemm_rule():
    """ag_mm takes cuBLAS only where AG_MM_GEMM says so, never with a generated epilogue, and not for
    chunks made of many short runs; every input is a shape (every rank decides alike)."""
    with knobs.symm.patch(AG_MM_GEMM="cublas", AG_CUBLAS_MIN_N=4096):
        assert symm_ag_mm.ag_gemm(1, 4096, 4096, 14336) == "cublas"
        assert symm_ag_mm.ag_gemm(1, 4096, 4096, 14336, epilogue=True) == "triton"
        assert symm_ag_mm.ag_gemm(4, 64, 4096, 14336) == "triton"  # runs of 64 rows
        assert symm_ag_mm.ag_gemm(4, 1024, 4096, 14336) == "cublas"
        assert symm_ag_mm.ag_gemm(1, 4096, 4096, 2048) == "triton"  # below AG_CUBLAS_MIN_N
        with knobs.symm.patch(AG_MM_GEMM="triton"):
            assert symm_ag_mm.ag_gemm(1, 4096, 4096, 14336) == "triton"
