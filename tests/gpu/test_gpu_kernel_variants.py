"""GPU tests (marker ``gpu``) of the ag_mm consumer kernel's store variants (``codegen/configs.py``) and tile
orders, one GPU.

Run on the device machine: ``python -m pytest -q -m gpu tests/gpu/test_gpu_kernel_variants.py``.

The flattened and warp-specialized tile loops let Triton issue a tile's loads away from where the kernel
wrote them; the kernel ties their row to the flag wait's result. Each variant runs here with the peers' shards
arriving late: the receive buffer holds NaN and the flags an old epoch while the kernel starts, and another
stream sleeps, then writes the shards and raises the flags. A load issued before its wait reads NaN. Every
result is checked against a float32 reference (random inputs, output poisoned), and again with every flag
raised before the launch. At decode sizes the same for both tile orders (``knobs.codegen.AG_MM_PEERS_BY_COLUMN_ROWS``)
and for the kernel that reads the whole gathered input (``knobs.codegen.AG_MM_WHOLE_ROWS``).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

EPOCH = 7
VARIANTS = [(128, 256, 64, 8, 3, 8, False), (128, 256, 64, 8, 3, 8, True),
            (128, 256, 64, 8, 3, 8, "tma_subtile"), (128, 256, 64, 8, 3, 8, "tma_ws"),
            (128, 256, 64, 8, 3, 8, "tma_flatten"), (128, 256, 64, 8, 4, 8, "tma_subtile_flatten"),
            (128, 128, 64, 8, 4, 8, "tma_flatten")]


# ag_mm's warp-specialized Gluon kernel (codegen/ag_mm_ws.py), both forms: no whole-input form, 128-row tiles;
# mm_rs's (codegen/mm_rs_ws.py), its staged tiles stored by TMA or by the threads, or both warpgroups sharing a tile
GLUON = [(128, 128, 64, 8, 4, 4, "ws_pingpong"), (128, 256, 64, 8, 3, 4, "ws_coop")]
RS_GLUON = (128, 128, 64, 8, 4, 4, "ws_pingpong")
RS_GLUON_DIRECT = RS_GLUON[:6] + ("ws_pingpong_direct",)
RS_GLUON_COOP = (128, 256, 64, 8, 3, 4, "ws_coop")


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    """``got``'s relative error (Frobenius norm) against the float32 reference ``want`` (NaN where ``got`` has one)."""
    return ((got.float() - want).norm() / want.norm()).item()


def _label(cfg) -> str:
    return "x".join(map(str, cfg[:3])) + f"-s{cfg[4]}-{cfg[6]}"


@pytest.fixture(scope="module")
def device():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import triton

    dev = torch.device("cuda")
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))
    return dev


def _run(cfg, device, late: bool, ws=4, rows=512, K=1024, N=2048, rank=1, band_rows=256, by_column=None,
         whole=None, timeout_ns=10**10, never=False):
    """(rel err, claim word) of ``ag_mm.launch`` as rank ``rank`` of ``ws``; ``late``: the peers' shards land ~10 ms
    after the launch; ``never``: they never do (the waits must give up after ``timeout_ns``)."""
    from overlap_backend.codegen import ag_mm

    torch.manual_seed(0)
    shards = [torch.randn(rows, K, device=device, dtype=torch.bfloat16) for _ in range(ws)]
    w = (torch.randn(N, K, device=device, dtype=torch.bfloat16) * K**-0.5).t()  # an nn.Linear weight
    bias = torch.randn(N, device=device, dtype=torch.bfloat16)
    buf = torch.full((ws, rows, K), float("nan"), device=device, dtype=torch.bfloat16)
    out = torch.full((ws * rows, N), float("nan"), device=device, dtype=torch.bfloat16)
    nbands = -(-rows // band_rows)
    flags = torch.full((ws * nbands,), EPOCH - 1 if late else EPOCH, device=device, dtype=torch.int32)
    status = (torch.zeros(1, device=device, dtype=torch.int32), torch.zeros(8, device=device, dtype=torch.int32))
    peers = torch.stack(shards)
    if not late:
        buf.copy_(peers)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    if late and not never:  # the shards land, then their flags rise, while the kernel already runs
        with torch.cuda.stream(side):
            torch.cuda._sleep(20_000_000)  # ~10 ms
            buf.copy_(peers)
            flags.fill_(EPOCH)
    # half the SMs: the side stream's copy and fill find SMs free beside the spinning CTAs
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count // 2
    from overlap_backend.spec import knobs

    with knobs.codegen.patch(AG_MM_PEERS_BY_COLUMN_ROWS=knobs.codegen.AG_MM_PEERS_BY_COLUMN_ROWS
                             if by_column is None else (rows if by_column else 0),
                             AG_MM_WHOLE_ROWS=knobs.codegen.AG_MM_WHOLE_ROWS if whole is None else (rows if whole else 0)):
        ag_mm.launch(shards[rank], buf, w, bias, out, flags, EPOCH, status, timeout_ns, rank, ws, rows, band_rows, cfg,
                     num_sms)
    torch.cuda.synchronize()
    ref = torch.cat(shards).float() @ w.float() + bias.float()
    err = _rel(out, ref)
    return err, status[0].item()


@pytest.mark.parametrize("cfg", VARIANTS + GLUON, ids=_label)
@pytest.mark.parametrize("late", [False, True], ids=["flags_set", "late_shards"])
def test_ag_mm_variants_wait_before_they_load(cfg, late, device):
    err, claimed = _run(cfg, device, late)
    print(f"{_label(cfg)} {'late shards' if late else 'flags set'}: rel err {err:.2e}")
    assert claimed == 0, "a wait gave up"
    assert err < 1e-2, f"rel err {err}"


DECODE = [(64, 256, 64, 8, 4, 4, False), (64, 256, 64, 8, 4, 4, True)]


@pytest.mark.parametrize("cfg", VARIANTS + DECODE, ids=_label)
@pytest.mark.parametrize("late", [False, True], ids=["flags_set", "late_shards"])
def test_ag_mm_whole_input_waits_before_it_loads(cfg, late, device):
    """Chunks of 64 rows at 8 ranks read as one gathered matrix (``knobs.codegen.AG_MM_WHOLE_ROWS``): every
    variant's CTAs wait for every peer's shard before their first tile; tiles span chunks."""
    err, claimed = _run(cfg, device, late, ws=8, rows=64, K=2048, N=4096, rank=3, band_rows=64, whole=True)
    print(f"{_label(cfg)} whole input {'late shards' if late else 'flags set'}: rel err {err:.2e}")
    assert claimed == 0, "a wait gave up"
    assert err < 1e-2, f"rel err {err}"


@pytest.mark.parametrize("cfg", DECODE, ids=_label)
@pytest.mark.parametrize("late", [False, True], ids=["flags_set", "late_shards"])
@pytest.mark.parametrize("by_column", [False, True], ids=["chunk_order", "column_order"])
def test_ag_mm_decode_tile_orders_wait_before_they_load(cfg, late, by_column, device):
    """Chunks of 64 rows at 8 ranks (decode): the peers' tiles chunk by chunk, or column block by column block,
    where a CTA's tiles visit the peers out of order and each checks its own flag."""
    err, claimed = _run(cfg, device, late, ws=8, rows=64, K=2048, N=4096, rank=3, band_rows=64, by_column=by_column,
                        whole=False)
    print(f"{_label(cfg)} {'column' if by_column else 'chunk'} order {'late shards' if late else 'flags set'}: "
          f"rel err {err:.2e}")
    assert claimed == 0, "a wait gave up"
    assert err < 1e-2, f"rel err {err}"


@pytest.mark.parametrize("cfg", GLUON, ids=_label)
@pytest.mark.parametrize("n", [2048, 1984], ids=["N2048", "N1984"])
@pytest.mark.parametrize("late", [False, True], ids=["flags_set", "late_shards"])
@pytest.mark.parametrize("by_column", [False, True], ids=["chunk_order", "column_order"])
def test_ag_mm_ws_tile_orders_wait_before_they_load(by_column, late, n, cfg, device):
    """The Gluon kernel at 8 ranks' 128-row chunks, in both tile orders (column by column, a CTA's tiles visit the
    peers out of order and its loader checks each band's flag), N a multiple of the tile or not."""
    err, claimed = _run(cfg, device, late, ws=8, rows=128, K=2048, N=n, rank=3, band_rows=128,
                        by_column=by_column, whole=False)
    print(f"{_label(cfg)} {'column' if by_column else 'chunk'} order N={n} "
          f"{'late shards' if late else 'flags set'}: rel err {err:.2e}")
    assert claimed == 0, "a wait gave up"
    assert err < 1e-2, f"rel err {err}"


@pytest.mark.parametrize("cfg", GLUON, ids=_label)
def test_ag_mm_ws_back_to_back_calls_on_new_tensors(cfg, device):
    """Calls queued back to back, each on tensors of its own (as the ops' calls are): every output right and
    nothing written into another call's. The kernel's TMA descriptors lie in global scratch that the next launch
    reuses; a partition copying through a descriptor it did not fence may read an earlier launch's (wrong tiles in
    the op at 2 ranks before each partition made its own)."""
    from overlap_backend.codegen import ag_mm

    ws, rows, K, N, rank, band_rows = 2, 1024, 1024, 2048, 1, 256
    nbands = rows // band_rows
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    status = (torch.zeros(1, device=device, dtype=torch.int32), torch.zeros(8, device=device, dtype=torch.int32))
    calls = []
    torch.manual_seed(0)
    for _ in range(8):
        shards = [torch.randn(rows, K, device=device, dtype=torch.bfloat16) for _ in range(ws)]
        w = (torch.randn(N, K, device=device, dtype=torch.bfloat16) * K**-0.5).t()
        buf = torch.stack(shards)
        out = torch.full((ws * rows, N), float("nan"), device=device, dtype=torch.bfloat16)
        flags = torch.full((ws * nbands,), EPOCH, device=device, dtype=torch.int32)
        ag_mm.launch(shards[rank], buf, w, None, out, flags, EPOCH, status, 10**10, rank, ws, rows, band_rows, cfg,
                     num_sms)
        calls.append((shards, w, out))
    torch.cuda.synchronize()
    errs = []
    for shards, w, out in calls:
        ref = torch.cat(shards).float() @ w.float()
        errs.append(_rel(out, ref))
    print(f"{_label(cfg)} 8 calls back to back: rel errs {[f'{e:.1e}' for e in errs]}")
    assert status[0].item() == 0, "a wait gave up"
    assert all(e < 1e-2 for e in errs), errs


@pytest.mark.parametrize("values", [0, 8, 16, 32], ids=["in_registers", "in_shared_pieces_8", "in_shared_pieces_16",
                                                      "in_shared_pieces_32"])
@pytest.mark.parametrize("spec", ["bias:0,gelu,add:1", "gelu_tanh"])
@pytest.mark.parametrize("cfg", GLUON, ids=_label)
def test_ag_mm_ws_generated_epilogue(cfg, spec, values, device):
    """The Gluon kernel with the op's generated epilogue (a ``tl`` function, on the accumulator's registers or on
    pieces of the tile in shared memory, 8, 16 or 32 values a thread each) after its own bias, the shards landing late: against float32 maths
    on the same inputs, output poisoned first."""
    from overlap_backend.codegen import ag_mm
    from overlap_backend.codegen import epilogue as gen
    from overlap_backend.spec import knobs

    torch.manual_seed(1)
    ws, rows, K, N, rank, band_rows = 4, 512, 1024, 1984, 2, 256
    dt = torch.bfloat16
    shards = [torch.randn(rows, K, device=device, dtype=dt) for _ in range(ws)]
    w = (torch.randn(N, K, device=device, dtype=dt) * K**-0.5).t()
    bias, extra = torch.randn(N, device=device, dtype=dt), torch.randn(N, device=device, dtype=dt)
    resid = torch.randn(ws * rows, N, device=device, dtype=dt)
    buf = torch.full((ws, rows, K), float("nan"), device=device, dtype=dt)
    out = torch.full((ws * rows, N), float("nan"), device=device, dtype=dt)
    flags = torch.full((ws * (rows // band_rows),), EPOCH - 1, device=device, dtype=torch.int32)
    status = (torch.zeros(1, device=device, dtype=torch.int32), torch.zeros(8, device=device, dtype=torch.int32))
    g = gen.build(spec, dt)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)
        buf.copy_(torch.stack(shards))
        flags.fill_(EPOCH)
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count // 2
    with knobs.codegen.patch(GLUON_EPILOGUE_VALUES=values):
        ag_mm.launch(shards[rank], buf, w, bias, out, flags, EPOCH, status, 10**10, rank, ws, rows, band_rows, cfg,
                     num_sms, epilogue=g, ep_ptrs=gen.pointers(g, [extra, resid]))
    torch.cuda.synchronize()
    h = torch.cat(shards).float() @ w.float() + bias.float()
    if spec == "gelu_tanh":
        ref = torch.nn.functional.gelu(h, approximate="tanh")
    else:
        ref = torch.nn.functional.gelu(h + extra.float()) + resid.float()
    err = _rel(out, ref)
    print(f"{_label(cfg)} epilogue {spec}: rel err {err:.2e}")
    assert status[0].item() == 0, "a wait gave up"
    assert err < 2e-2, f"rel err {err}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cfg", [VARIANTS[1]] + GLUON, ids=_label)
def test_ag_mm_wait_that_gives_up_ends_the_kernel_and_reports(cfg, device):
    """Shards that never arrive: the bounded waits give up (50 ms), the kernel ends and the claim word is set, so the
    host can raise instead of hanging (the Gluon kernel's waits sit in its loader partition)."""
    err, claimed = _run(cfg, device, True, never=True, timeout_ns=50_000_000)
    print(f"{_label(cfg)} shards never sent: claim {claimed}")
    assert claimed == 1


def measured_variant_worker(rank: int, ws: int, device: str, ratio_dir: str, ag_variant: list, rs_variant: list):
    """Each op at a shape whose ratio entry names a variant that beat the candidates (``ag_variant`` for ``ag_mm``,
    ``rs_variant`` for ``mm_rs``), none of them held back (``knobs.codegen.VARIANTS_NOT_ADOPTED`` empty): with no
    other candidate (``CANDIDATES_16BIT=()``), the op must tune over that variant, run it and get the right result.
    Then ``ag_mm`` + bias + GELU at the same shape: it tunes apart, over the same variant, and gets the right
    result."""
    import json
    from pathlib import Path

    import torch.distributed as dist

    try:
        from test_gpu import _all_reduce_ref, _gather_ref, _randn, _rel_err, _setup_rank
    except ImportError:
        from tests.gpu.test_gpu import _all_reduce_ref, _gather_ref, _randn, _rel_err, _setup_rank
    _setup_rank(rank, device)
    from overlap_backend.runtime.symm.lowering_helpers import tuned_configs
    from overlap_backend.spec import kernel_ratios, knobs

    group = dist.group.WORLD
    gn = group.group_name
    K, N, rows = 1024, 2048, 1024
    variants = {"ag_mm": ag_variant, "mm_rs": rs_variant,
                "mm_ar": [128, 256, 64, 4, 3, 8, False]}
    gpu = kernel_ratios.gpu_name()
    entries = [{"gpu": gpu, "kernel": k, "dtype": "bfloat16", "ws": ws, "M": ws * rows, "K": K, "N": N, "fused": fused,
                "ratio": 1.0, "best_variant_ratio": 0.9, "best_config": v}
               for k, v in variants.items() for fused in (False, True)]
    path = Path(ratio_dir) / f"ratios_rank{rank}.json"
    path.write_text(json.dumps(kernel_ratios.document(entries)))
    knobs.symm.set(KERNEL_RATIOS_FILE=str(path), AG_MM_GEMM="triton", MM_RS_GEMM="triton")
    knobs.codegen.set(CANDIDATES_16BIT=(), VARIANTS_NOT_ADOPTED={})
    kernel_ratios.forget()
    dt = torch.bfloat16
    shard = _randn(rows, K, dtype=dt, device=device)
    w = _randn(K, N, dtype=dt, device=device, scale=K**-0.5)
    a = _randn(ws * rows, K, dtype=dt, device=device)
    out_ag = torch.ops.overlap.ag_mm(shard, [w], [None], 0, gn, "symm", False)[1][0]
    out_rs = torch.ops.overlap.mm_rs(a, w, None, [ws * rows, N], 0, "sum", gn, "symm")
    out_ar = torch.ops.overlap.mm_ar(a, w, None, "sum", gn, "symm")
    plain_keys = set(tuned_configs)
    bias = _randn(N, dtype=dt, device=device)
    out_gelu = torch.ops.overlap.ag_mm(shard, [w], [None], 0, gn, "symm", False, "bias:0,gelu", [bias])[1][0]
    torch.cuda.synchronize()
    gathered = _gather_ref(shard, 0, group).float() @ w.float()
    full = _all_reduce_ref(a.float() @ w.float(), group)
    errs = {"ag_mm": _rel_err(out_ag, gathered), "mm_rs": _rel_err(out_rs, full.chunk(ws)[rank]),
            "mm_ar": _rel_err(out_ar, full),
            "ag_mm bias+gelu": _rel_err(out_gelu, torch.nn.functional.gelu(gathered + bias.float()))}
    fused_tuned = [list(v) for k, v in tuned_configs.items() if k not in plain_keys and k[0] == "ag_mm"]
    assert fused_tuned == [list(ag_variant)], f"ag_mm bias+gelu tuned {fused_tuned}, not {ag_variant}"
    tuned = {k[0]: v for k, v in tuned_configs.items() if k in plain_keys}
    return errs, {k: list(v) for k, v in tuned.items()}, variants


@pytest.mark.timeout(200)
@pytest.mark.parametrize("ag_variant,rs_variant", [
    ([128, 256, 64, 8, 4, 8, "tma_subtile_flatten"], [128, 256, 64, 4, 3, 8, False]),
    (list(GLUON[1]), list(RS_GLUON)),
    (list(GLUON[0]), list(RS_GLUON_DIRECT)),
    (list(GLUON[1]), list(RS_GLUON_COOP)),
], ids=["tma_subtile_flatten", "gluon_coop", "gluon_pingpong", "gluon_coop_both"])
def test_ops_run_the_measured_variant(tmp_path, ag_variant, rs_variant):
    try:
        from test_gpu import _need_gpus, _run
    except ImportError:
        from tests.gpu.test_gpu import _need_gpus, _run
    _need_gpus(2, "symm")
    for errs, tuned, variants in _run(measured_variant_worker, 2, str(tmp_path), ag_variant, rs_variant,
                                      timeout=180):
        print(f"rel errs {errs}; tuned {tuned}")
        assert all(e < 1e-2 for e in errs.values()), errs
        for k, v in variants.items():
            assert tuned.get(k) == v, f"{k} tuned {tuned.get(k)}, not the measured variant {v}"


# ---------------------------------------------------------------- several CTAs per SM (PERSISTENT_CTAS_PER_SM)
TWO_PER_SM = [(128, 128, 64, 8, 2, 4, True), (64, 128, 64, 8, 3, 4, False), (128, 256, 64, 8, 3, 8, True)]


def _rs_words(n: int, late: bool, device):
    """(receive flags, counters, done flags, ticket, status) of an mm_rs / mm_ar launch with ``n`` (round, chunk, band)
    words: the receive flags at the epoch, or one below it where the partials land late."""
    flags = torch.full((n,), EPOCH - 1 if late else EPOCH, device=device, dtype=torch.int32)
    counters, done = (torch.zeros(n, device=device, dtype=torch.int32) for _ in range(2))
    status = (torch.zeros(1, device=device, dtype=torch.int32), torch.zeros(8, device=device, dtype=torch.int32))
    return flags, counters, done, torch.zeros(1, device=device, dtype=torch.int32), status


def _partials_land(recv, peers, flags, late: bool):
    """The peers' partials into ``recv``, their flags raised: now, or (``late``) ~10 ms after the next launch, by
    another stream that sleeps first."""
    if not late:
        recv.copy_(peers)
    torch.cuda.synchronize()
    if late:
        with torch.cuda.stream(torch.cuda.Stream()):
            torch.cuda._sleep(20_000_000)
            recv.copy_(peers)
            flags.fill_(EPOCH)


def _run_mm_rs(cfg, device, late: bool, ws=4, rows=1024, K=256, N=2048, rank=1, band_rows=256, bias=False,
               spec="", average=False):
    """mm_rs's producer on one GPU as rank ``rank`` of ``ws``: the peers' partials of this rank's chunk in
    ``recv`` (late: NaN and old flags at the launch, written and raised ~10 ms later by another stream); with a bias
    on every partial, the generated epilogue ``spec`` (``add:0``: a residual; ``gelu``) on the reduced chunk, or the
    average. Returns (rel err of the reduced chunk, of the staged chunks, claim word)."""
    from overlap_backend.codegen import epilogue as gen
    from overlap_backend.codegen import mm_rs

    torch.manual_seed(0)
    a = torch.randn(ws * rows, K, device=device, dtype=torch.bfloat16)
    w = (torch.randn(K, N, device=device, dtype=torch.bfloat16) * K**-0.5)
    peers = torch.randn(ws * rows, N, device=device, dtype=torch.bfloat16)  # what every peer sends this rank
    recv = torch.full((ws * rows, N), float("nan"), device=device, dtype=torch.bfloat16)
    stage = torch.full((ws * rows, N), float("nan"), device=device, dtype=torch.bfloat16)
    out = torch.full((rows, N), float("nan"), device=device, dtype=torch.bfloat16)
    nbands = -(-rows // band_rows)
    flags, counters, done, ticket, status = _rs_words(ws * nbands, late, device)
    _partials_land(recv, peers, flags, late)
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count // 2
    b = torch.randn(N, device=device, dtype=torch.bfloat16) if bias else None
    resid = torch.randn(rows, N, device=device, dtype=torch.bfloat16)
    g = gen.build(spec, torch.bfloat16) if spec else None
    mm_rs.launch(a, w, b, stage, recv, None, out, counters, done, flags, ticket, EPOCH, status, 10**10, rank, ws,
                 rows, rows, 1, 0, 0, average, band_rows, cfg, num_sms, epilogue=g,
                 ep_ptrs=gen.pointers(g, [resid]) if g is not None else ())
    torch.cuda.synchronize()
    full = a.float() @ w.float() + (b.float() if bias else 0.0)
    mine = full[rank * rows:(rank + 1) * rows]
    ref = mine + sum(peers[p * rows:(p + 1) * rows].float() for p in range(ws) if p != rank)
    ref = ref / ws if average else ref
    ref = ref + resid.float() if "add:0" in spec else ref
    ref = torch.nn.functional.gelu(ref) if "gelu" in spec else ref
    err = _rel(out, ref)
    remote = [c for c in range(ws) if c != rank]
    staged = torch.cat([stage[c * rows:(c + 1) * rows] for c in remote]).float()
    staged_ref = torch.cat([full[c * rows:(c + 1) * rows] for c in remote])
    staged_err = _rel(staged, staged_ref)
    assert ticket.item() == 0, "the tile ticket is reset for the next call"
    assert (done == EPOCH).sum().item() == (ws - 1) * nbands, "every remote band's done flag raised"
    return err, staged_err, status[0].item()


@pytest.mark.parametrize("cfg", TWO_PER_SM, ids=_label)
@pytest.mark.parametrize("late", [False, True], ids=["flags_set", "late_partials"])
def test_mm_rs_with_two_ctas_per_sm(cfg, late, device):
    """Short K (few main-loop steps per tile), up to two CTAs per SM: the tickets, the staged bands' counts and
    the own tiles' waits hold with twice the CTAs in flight."""
    from overlap_backend.spec import knobs

    with knobs.codegen.patch(PERSISTENT_CTAS_PER_SM=2):
        err, staged_err, claimed = _run_mm_rs(cfg, device, late)
    print(f"{_label(cfg)} {'late partials' if late else 'flags set'}: rel err {err:.2e}, staged {staged_err:.2e}")
    assert claimed == 0, "a wait gave up"
    assert err < 1e-2 and staged_err < 1e-2, (err, staged_err)


@pytest.mark.parametrize("cfg", [(128, 256, 64, 8, 3, 8, False), (128, 128, 64, 8, 4, 4, False)], ids=_label)
@pytest.mark.parametrize("late", [False, True], ids=["flags_set", "late_partials"])
@pytest.mark.parametrize("ws,rows,rank", [(8, 64, 5), (8, 32, 0), (2, 64, 1)],
                         ids=["ws8_rows64_rank5", "ws8_rows32_rank0", "ws2_rows64_rank1"])
def test_mm_rs_tiles_span_short_chunks(ws, rows, rank, late, cfg, device):
    """Decode sizes, chunks shorter than a tile: each 128-row tile covers 128 / rows chunks (``span_chunks``), its
    remote chunks staged and signalled before the own chunk's rows wait for and add the peers' partials."""
    from overlap_backend.codegen import mm_rs
    from overlap_backend.spec import knobs

    with knobs.codegen.patch(RS_SPAN_CHUNKS=True):
        assert mm_rs.span_chunks(rows, rows, cfg[0], ws, False, False) == cfg[0] // rows
        err, staged_err, claimed = _run_mm_rs(cfg, device, late, ws=ws, rows=rows, K=896, N=8192 - 64, rank=rank,
                                              band_rows=512, bias=True)
    print(f"{_label(cfg)} ws={ws} rows={rows} {'late partials' if late else 'flags set'}: rel err {err:.2e}, "
          f"staged {staged_err:.2e}")
    assert claimed == 0, "a wait gave up"
    assert err < 1e-2 and staged_err < 1e-2, (err, staged_err)


@pytest.mark.parametrize("cfg", [RS_GLUON, RS_GLUON_DIRECT, RS_GLUON_COOP], ids=_label)
@pytest.mark.parametrize("late", [False, True], ids=["flags_set", "late_partials"])
@pytest.mark.parametrize("shape", [(4, 1024, 256, 2048), (8, 512, 1024, 1984), (2, 2048, 64, 4096)],
                         ids=lambda s: "ws{}_rows{}_K{}_N{}".format(*s))
def test_mm_rs_ws_stages_counts_and_reduces(shape, late, cfg, device):
    """mm_rs's Gluon producer: the remote chunks staged and every band's done flag raised, the own chunk reduced with
    the peers' partials (late: they land ~10 ms after the launch, NaN until then), the ticket reset; short K (one
    K-chunk a tile), N not a multiple of the tile, 2 to 8 ranks."""
    ws, rows, K, N = shape
    err, staged_err, claimed = _run_mm_rs(cfg, device, late, ws=ws, rows=rows, K=K, N=N, rank=ws - 1, band_rows=256)
    print(f"mm_rs {cfg[6]} ws={ws} rows={rows} K={K} N={N} {'late' if late else 'set'}: rel err {err:.2e}, "
          f"staged {staged_err:.2e}")
    assert claimed == 0, "a wait gave up"
    assert err < 1e-2 and staged_err < 1e-2, (err, staged_err)


@pytest.mark.parametrize("cfg", [RS_GLUON, RS_GLUON_DIRECT, RS_GLUON_COOP], ids=_label)
@pytest.mark.parametrize("fused", [dict(bias=True), dict(spec="add:0"), dict(spec="gelu", average=True)],
                         ids=["bias", "residual", "average_gelu"])
def test_mm_rs_ws_bias_epilogue_and_average(fused, cfg, device):
    """mm_rs's Gluon producer with a bias on every partial, a generated epilogue on the reduced chunk (in shared
    memory pieces, the peers' partials summed there) or the average, the partials landing late."""
    err, staged_err, claimed = _run_mm_rs(cfg, device, True, **fused)
    print(f"mm_rs {cfg[6]} {fused}: rel err {err:.2e}, staged {staged_err:.2e}")
    assert claimed == 0, "a wait gave up"
    assert err < 1e-2 and staged_err < 1e-2, (err, staged_err)


@pytest.mark.timeout(60)
def test_mm_rs_ws_wait_that_gives_up_ends_the_kernel_and_reports(device):
    """Partials that never arrive: the own tiles' bounded waits give up (50 ms), the kernel ends and the claim word
    is set, so that the host raises instead of hanging."""
    from overlap_backend.codegen import mm_rs

    ws, rows, K, N = 4, 512, 256, 1024
    a = torch.randn(ws * rows, K, device=device, dtype=torch.bfloat16)
    w = torch.randn(K, N, device=device, dtype=torch.bfloat16)
    bufs = [torch.zeros(ws * rows, N, device=device, dtype=torch.bfloat16) for _ in range(2)]
    out = torch.zeros(rows, N, device=device, dtype=torch.bfloat16)
    ints = [torch.zeros(n, device=device, dtype=torch.int32) for n in (ws * 2, ws * 2, ws * 2, 1)]
    status = (torch.zeros(1, device=device, dtype=torch.int32), torch.zeros(8, device=device, dtype=torch.int32))
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    mm_rs.launch(a, w, None, bufs[0], bufs[1], None, out, *ints, EPOCH, status, 50_000_000, 0, ws, rows, rows, 1, 0,
                 0, False, 256, RS_GLUON, num_sms)
    torch.cuda.synchronize()
    print(f"mm_rs ws_pingpong partials never sent: claim {status[0].item()}")
    assert status[0].item() == 1
    assert ints[3].item() == 0, "the ticket is reset even so"


@pytest.mark.parametrize("cfg", TWO_PER_SM, ids=_label)
def test_ag_mm_with_two_ctas_per_sm(cfg, device):
    from overlap_backend.spec import knobs

    with knobs.codegen.patch(PERSISTENT_CTAS_PER_SM=2):
        err, claimed = _run(cfg, device, late=True)
    assert claimed == 0, "a wait gave up"
    assert err < 1e-2, f"rel err {err}"


def test_resident_ctas_match_the_cuda_occupancy_api(device, monkeypatch):
    """``launcher.resident_per_sm`` (the persistent grid's CTAs per SM) against the driver's own occupancy
    calculation, for the variants the two-per-SM tests compile."""
    from overlap_backend.codegen import launcher
    from overlap_backend.runtime import cuda as rt_cuda
    from overlap_backend.spec import knobs

    seen = []
    load = launcher._load
    monkeypatch.setattr(launcher, "_load", lambda *a: seen.append(load(*a)) or seen[-1])
    monkeypatch.setattr(launcher, "_resident_cache", {})
    with knobs.codegen.patch(PERSISTENT_CTAS_PER_SM=8):
        for cfg in TWO_PER_SM:
            _run_mm_rs(cfg, device, late=False)
    assert len(seen) == len(TWO_PER_SM)
    driver = rt_cuda._bindings()[0]
    props = torch.cuda.get_device_properties(device)
    for compiled in seen:
        warps, shared = compiled.metadata.num_warps, compiled.metadata.shared
        err, blocks = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(driver.CUfunction(compiled.function),
                                                                         32 * warps, shared)
        assert int(err) == 0, err
        ours = launcher.resident_per_sm(shared, compiled.n_regs, warps, props)
        print(f"shared {shared} B, {compiled.n_regs} regs x {warps} warps: ours {ours}, CUDA {blocks}")
        assert ours == max(1, blocks)



# The MoE down GEMM's warp-specialized Gluon forms (codegen/moe_down_ws.py)
MOE_GLUON = [(128, 128, 64, 8, 4, 4, "ws_pingpong"), (128, 256, 64, 8, 3, 4, "ws_coop"),
             (64, 256, 64, 8, 4, 4, "ws_pingpong")]


def _moe_down_case(device, ws, rank, experts, h, f, recv, expert_major, seed):
    """A down GEMM's inputs as the op has them: grouped rows (sources' rows sorted by expert, but source 0's, whose
    experts are drawn row by row: groups of rows that are not consecutive, stored by pointers), the plan, ``act`` in
    its sorted order, and the float32 reference of every received row."""
    from overlap_backend.runtime import moe_symm

    gen = torch.Generator().manual_seed(seed)
    n_recv = sum(recv)
    expert_of = torch.randint(0, experts, (n_recv,), generator=gen)
    expert_of[expert_of == experts - 1] = 0  # an expert with no rows
    off = [0]
    for n in recv:
        off.append(off[-1] + n)
    for s in range(1, ws):
        expert_of[off[s]:off[s + 1]] = expert_of[off[s]:off[s + 1]].sort().values
    rows = torch.sort(expert_of, stable=True).indices.to(device)
    ends = torch.cumsum(torch.bincount(expert_of, minlength=experts), 0).to(device)
    recv_off = torch.tensor(off, dtype=torch.int32, device=device)
    pl = moe_symm.plan_reference(rows, ends, recv_off, rank, ws, experts, [64, 128], expert_major)
    act = torch.randn(n_recv, f, device=device, dtype=torch.bfloat16)
    ref = torch.zeros(n_recv, h, device=device)
    counts, starts, srows = pl["counts"].tolist(), pl["row_start"].tolist(), pl["srows"].long()
    return pl, act, off, counts, starts, srows, ref


# (form, weights K-major, expert-major order, CTAs): each form in both weight layouts and both orders, one
# compilation per case (each a Gluon compilation of some 25 s)
MOE_GLUON_CASES = [(MOE_GLUON[0], False, False, 132), (MOE_GLUON[0], True, True, 132), (MOE_GLUON[1], False, False, 7),
                   (MOE_GLUON[1], True, True, 132), (MOE_GLUON[2], False, True, 132), (MOE_GLUON[2], True, False, 7)]


@pytest.mark.parametrize("cfg,k_major,expert_major,grid", MOE_GLUON_CASES,
                         ids=[f"{_label(c)}-{'kmajor' if k else 'kxn'}-{'expert_major' if e else 'remote_first'}-{g}ctas"
                              for c, k, e, g in MOE_GLUON_CASES])
def test_moe_down_ws_scatters_and_counts(cfg, k_major, expert_major, grid, device):
    """The MoE down GEMM's Gluon forms, launched phase by phase as the op does: own rows into ``out`` at their send
    position, remote rows into the staging buffer at their received position (full tiles of consecutive rows by
    TMA, others by pointers: partial tiles, a source whose groups are not consecutive), every remote source's done
    flag raised (one with no rows too), the counters back to 0; twice, on new tensors, against float32."""
    from overlap_backend.codegen import moe_gemm

    ws, rank, experts, h, f = 4, 1, 4, 1000, 512
    recv = [300, 200, 0, 517]  # source 2 sent nothing; partial row tiles and a partial column tile (H = 1000)
    flags = torch.zeros(64, device=device, dtype=torch.int32)
    for call in range(2):
        pl, act, off, counts, starts, srows, ref = _moe_down_case(device, ws, rank, experts, h, f, recv, expert_major,
                                                                  call)
        w = torch.randn(experts, h, f, device=device, dtype=torch.bfloat16) * f**-0.5
        w = w.transpose(1, 2) if k_major else w.transpose(1, 2).contiguous()  # [E, F, H], K- or N-contiguous
        for g, (c, s0) in enumerate(zip(counts, starts)):
            if c:
                e = g // ws if expert_major else g % experts
                ref[srows[s0:s0 + c]] = act[s0:s0 + c].float() @ w[e].float()
        own_row0 = 3
        out = torch.full((own_row0 + recv[rank] + 5, h), float("nan"), device=device, dtype=torch.bfloat16)
        stage = torch.full((sum(recv), h), float("nan"), device=device, dtype=torch.bfloat16)
        assert moe_gemm.down_unsupported(cfg, act, w, out, stage) is None
        for phase in moe_gemm.phases(ws, experts, expert_major):
            moe_gemm.launch_down(act, w, out, stage, pl, flags[16:], flags[32:], EPOCH + call, rank, ws, own_row0,
                                 cfg, grid, phase=phase)
        torch.cuda.synchronize()
        own = out[own_row0:own_row0 + recv[rank]].float()
        want_own = ref[off[rank]:off[rank + 1]]
        err_own = _rel(own, want_own)
        remote = torch.cat([stage[off[s]:off[s + 1]] for s in range(ws) if s != rank]).float()
        want = torch.cat([ref[off[s]:off[s + 1]] for s in range(ws) if s != rank])
        err = _rel(remote, want)
        print(f"moe down {cfg[6]} {'kmajor' if k_major else 'kxn'} {'expert-major' if expert_major else 'remote-first'} "
              f"grid {grid} call {call}: rel err own {err_own:.2e}, staged {err:.2e}")
        assert err_own < 1e-2 and err < 1e-2, (err_own, err)
        assert torch.isnan(out[:own_row0].float()).all() and torch.isnan(out[own_row0 + recv[rank]:].float()).all()
        assert flags[32:32 + ws - 1].tolist() == [EPOCH + call] * (ws - 1), "every remote source's done flag"
        assert flags[16:16 + ws].tolist() == [0] * ws, "counters reset for the next call"


# CTA stage 0's warp-specialized Gluon forms (codegen/cta_ws.py)
@pytest.mark.parametrize("form,act,bias,tail,first_at_once", [
    ("ws_pingpong", "gelu_tanh", False, False, True), ("ws_pingpong", "gelu", True, True, False),
    ("ws_coop", "gelu", True, True, False), ("ws_coop", "gelu_tanh", True, True, True),
], ids=["pingpong_tanh_all_shipped", "pingpong_erf_bias_tail", "coop_erf_bias_tail",
        "coop_tanh_bias_tail_first_group_at_once"])
def test_cta_stage0_ws_stages_blocks_and_counts(form, act, bias, tail, first_at_once, device):
    """CTA stage 0 in a Gluon form, on the copy-engine transport: each shipped tile in its K-chunk's block of the
    staging buffer (rows past M in the block's padding), the tail group's last columns into ``keep``, every shipped
    (row group, K-chunk) counted to its done flag (the tail's chunks not), the counters back to 0; W1 a window of a
    wider weight; twice, on new tensors, against float32."""
    import torch.nn.functional as F

    from overlap_backend.codegen import cta

    M, H, Fp, ldw, kchunk = 1000, 1024, 2048, 2560, 512
    cfg0 = (128, 256, 64, 4, 3, 8)  # the plan's config: 8 row blocks in 2 row groups
    bm, group_m = cfg0[0], cfg0[3]
    mp, nch, groups = -(-M // bm) * bm, Fp // kchunk, -(-M // (bm * group_m))
    tail_group = groups - 1
    fship = Fp - kchunk if tail else Fp  # the last group keeps its last chunk's columns
    m0 = tail_group * group_m * bm
    code = cta.ACTIVATIONS[("gelu", "tanh" if act == "gelu_tanh" else "none")]
    counters = torch.zeros(64, device=device, dtype=torch.int32)
    done = torch.zeros(64, device=device, dtype=torch.int32)
    status = (torch.zeros(1, device=device, dtype=torch.int32), torch.zeros(8, device=device, dtype=torch.int32))
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    for call in range(2):
        torch.manual_seed(call)
        x = torch.randn(M, H, device=device, dtype=torch.bfloat16)
        wide = torch.randn(H, ldw, device=device, dtype=torch.bfloat16) * H**-0.5
        w1 = wide[:, 256:256 + Fp]  # a window: rows ldw apart
        b1 = torch.randn(Fp, device=device, dtype=torch.bfloat16) if bias else None
        h = x.float() @ w1.float() + (b1.float() if bias else 0)
        want = F.gelu(h, approximate="tanh" if act == "gelu_tanh" else "none")
        stage = torch.full((nch * mp * kchunk,), float("nan"), device=device, dtype=torch.bfloat16)
        keep = torch.full(((mp - m0) * (Fp - fship),), float("nan"), device=device, dtype=torch.bfloat16) if tail else None
        epoch = torch.full((1,), EPOCH + call, device=device, dtype=torch.int32)
        cta.launch_stage0(x, w1, b1, None, None, stage, counters, counters, counters, done, epoch, 0, kchunk, nch, 0,
                          1, 1, code, cfg0, num_sms, status=status, timeout_ns=10**10, fship=fship, keep=keep,
                          tail_group=tail_group, tma_store=True, count_first_at_once=first_at_once, form=form)
        torch.cuda.synchronize()
        blocks = stage.view(nch, mp, kchunk)
        got = blocks[:, :M].permute(1, 0, 2).reshape(M, Fp).float()
        shipped = torch.ones(M, Fp, dtype=torch.bool, device=device)
        shipped[m0:, fship:] = False  # the tail: never stored into the blocks
        err = _rel(got[shipped], want[shipped])
        assert torch.isnan(got[~shipped]).all(), "tail columns stored into the staging blocks"
        if tail:
            kept = keep.view(mp - m0, Fp - fship)[:M - m0].float()
            tail_err = _rel(kept, want[m0:, fship:])
        else:
            tail_err = 0.0
        print(f"cta stage 0 {form} {act} bias={bias} tail={tail} at-once={first_at_once} call {call}: rel err "
              f"{err:.2e}, tail {tail_err:.2e}")
        assert status[0].item() == 0
        assert err < 1e-2 and tail_err < 1e-2, (err, tail_err)
        for g in range(groups):
            for j in range(nch):
                ships = g != tail_group or j * kchunk < fship
                assert done[g * nch + j].item() == (EPOCH + call if ships else 0), (g, j)
        assert counters[:groups * nch].eq(0).all(), "counters reset for the next call"


@pytest.mark.parametrize("cfg", [RS_GLUON, RS_GLUON_COOP], ids=_label)
@pytest.mark.parametrize("late", [False, True], ids=["flags_set", "late_partials"])
def test_mm_ar_ws_rounds_reduce_and_gather(late, cfg, device):
    """mm_ar's rounds on mm_rs's Gluon producer: each round's remote chunks staged, its own chunk reduced with the
    peers' partials (late: they land ~10 ms after the launch, NaN until then) into ``out`` at the rank's rows of the
    round and into its slot of the gather region, every band of every (round, chunk) counted to its done flag, the
    last round shorter than the others (rows past M), the ticket reset."""
    from overlap_backend.codegen import mm_rs

    ws, rows, rounds, K, N, rank, band_rows = 4, 512, 2, 512, 1984, 1, 256
    M = rounds * ws * rows - 200
    torch.manual_seed(0)
    a = torch.randn(M, K, device=device, dtype=torch.bfloat16)
    w = torch.randn(K, N, device=device, dtype=torch.bfloat16) * K**-0.5
    peers = torch.randn(rounds * ws * rows, N, device=device, dtype=torch.bfloat16)  # slot t*ws + p: peer p's partial
    recv, stage, gather = (torch.full((rounds * ws * rows, N), float("nan"), device=device, dtype=torch.bfloat16)
                           for _ in range(3))
    out = torch.full((M, N), float("nan"), device=device, dtype=torch.bfloat16)
    nbands = -(-rows // band_rows)
    flags, counters, done, ticket, status = _rs_words(rounds * ws * nbands, late, device)
    _partials_land(recv, peers, flags, late)
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count // 2
    mm_rs.launch(a, w, None, stage, recv, gather, out, counters, done, flags, ticket, EPOCH, status, 10**10, rank, ws,
                 rows, rows, rounds, ws * rows, rank * rows, False, band_rows, cfg, num_sms)
    torch.cuda.synchronize()
    full = a.float() @ w.float()
    errs = []
    for t in range(rounds):
        for c in range(ws):
            lo = t * ws * rows + c * rows  # the chunk's first row of A (and of out)
            n = max(0, min(rows, M - lo))
            if not n:
                continue
            slot = (t * ws + c) * rows
            if c != rank:
                errs.append(_rel(stage[slot:slot + n], full[lo:lo + n]))
                continue
            ref = full[lo:lo + n] + sum(peers[(t * ws + p) * rows:(t * ws + p) * rows + n].float()
                                        for p in range(ws) if p != rank)
            errs.append(_rel(out[lo:lo + n], ref))
            errs.append(_rel(gather[slot:slot + n], ref))
    print(f"mm_ar {cfg[6]} rounds={rounds} {'late' if late else 'set'}: rel errs {max(errs):.2e} (max of {len(errs)})")
    assert status[0].item() == 0, "a wait gave up"
    assert max(errs) < 1e-2, errs
    assert done.eq(EPOCH).all(), "every band of every (round, chunk) counted, the own ones for the all-gather"
    assert counters.eq(0).all() and ticket.item() == 0
