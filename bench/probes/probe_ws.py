"""Probe (one GPU): does Triton's warp specialization close the gap between our persistent TMA GEMMs
and cuBLAS on Hopper?

The CTA op's stage-0 and stage-1 kernels are persistent Triton GEMMs (an outer loop over tiles, an
inner K-loop) at 1.07-1.16x cuBLAS's time on H200s (bench/results/cta_h200x2_2026-11-30/last_group_tails). A
CTA's epilogue does not overlap its next tile's main loop. ``tl.range(..., warp_specialize=True)``
splits loads and MMAs into separate warp groups; Triton documented it for Blackwell first, and later
versions run it on Hopper too. This times the same persistent GEMM (C = A @ B, B row-major like the
op's weights; optionally the op's GELU epilogue) with and without it, and with its tiles drawn
from an atomic ticket in a while loop (``ws=ticket``: the mm_rs kernel's loop) or statically in a while
loop (``ws=while``), or drawn in a for loop then a while loop (``ws=ticket_for``), against ``torch.mm``, after
checking each result against a float32 reference on fresh random inputs (outputs poisoned first).

    python bench/probes/probe_ws.py [--shapes 1024x8192x28672,512x8192x28672] [--configs 128x256x64x3x8,...]
                             [--epilogues none,gelu,gelu_fast,...] [--no-ws] [--stage0] [--mm-rs 2,4] [--ag-mm 2,4]

``--epilogues`` compares ways of writing the activation in the epilogue (what a persistent kernel's
epilogue costs is not overlapped with its next tile's main loop): the op's current GELU (tanh form,
``2 sigmoid(2u) - 1`` with an IEEE division), ``h sigmoid(2u)``, the same with ``exp2`` and
``rcp.approx`` (two MUFU instructions), ``tanh.approx``, exact GELU (erf), and SiLU plain / fast.

``--ag-mm`` does the same for the ``ag_mm`` consumer kernel, plain and with a fused bias + GELU
epilogue against cuBLAS ``addmm`` followed by ``F.gelu`` (is fusing worth the Triton GEMM?).
``--mm-rs`` times the ``mm_rs`` producer kernel alone instead (rank 0 of a group of each size, every
flag raised, the peers' partials already local): its GEMM rate against cuBLAS at the local shapes of
the collective benchmark's table, with pointer stores and with its TMA variant.

Not a benchmark of record: a diagnostic. Prints one line per (shape, config, variant): ms and the ratio to
cuBLAS, the variant's calls alternating with cuBLAS's (``common.paired_queued_ms``: the GPU's clock drifts
under a sustained load, so timings made one after the other compare clock states too), or why the variant
did not compile; ``--rounds N``: the plain GEMM's variants in N interleaved rounds instead.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from bench.tools.common import events_ms, paired_queued_ms  # noqa: E402


@triton.jit
def _fast_rcp(x):
    """1 / x by one MUFU instruction (rcp.approx, about 1 ulp) instead of an IEEE division."""
    return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def _epilogue(h, EPI: tl.constexpr):
    """The activation variants compared by --epilogues (EPILOGUES: their names), in float32."""
    if EPI == 1:  # GELU tanh as the op's codegen writes it (cta._activation): 0.5 h (1 + (2 sigmoid(2u) - 1))
        u = 0.7978845608028654 * (h + 0.044715 * h * h * h)
        h = 0.5 * h * (1.0 + (2.0 * tl.sigmoid(2.0 * u) - 1.0))
    elif EPI == 2:  # the same function as h sigmoid(2u) (0.5 (1 + tanh u) = sigmoid(2u)), tl.sigmoid
        u = 1.5957691216057308 * (h + 0.044715 * h * h * h)
        h = h * tl.sigmoid(u)
    elif EPI == 3:  # h sigmoid(2u) with exp2 and rcp.approx: two MUFU instructions, no IEEE division
        u = -2.302208198144325 * (h + 0.044715 * h * h * h)  # -2 * sqrt(2/pi) * log2(e)
        h = h * _fast_rcp(1.0 + tl.math.exp2(u))
    elif EPI == 4:  # 0.5 h (1 + tanh.approx(u)): one MUFU instruction (abs. error ~2^-11 near h << 0)
        u = 0.7978845608028654 * (h + 0.044715 * h * h * h)
        t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [u], dtype=tl.float32, is_pure=True, pack=1)
        h = 0.5 * h * (1.0 + t)
    elif EPI == 5:  # exact GELU (erf), as cta._activation's ACT_GELU
        h = 0.5 * h * (1.0 + tl.math.erf(h * 0.7071067811865476))
    elif EPI == 6:  # SiLU as codegen writes it: h * sigmoid(h)
        h = h * tl.sigmoid(h)
    elif EPI == 7:  # SiLU with exp2 and rcp.approx
        h = h * _fast_rcp(1.0 + tl.math.exp2(-1.4426950408889634 * h))
    return h


EPILOGUES = {"none": 0, "gelu": 1, "gelu_hsig": 2, "gelu_fast": 3, "gelu_tanh_approx": 4, "gelu_erf": 5,
             "silu": 6, "silu_fast": 7}


def _reference(ref, name):
    F = torch.nn.functional
    if name.startswith("gelu_erf"):
        return F.gelu(ref)
    if name.startswith("gelu"):
        return F.gelu(ref, approximate="tanh")
    if name.startswith("silu"):
        return F.silu(ref)
    return ref


@triton.jit
def _plain_tile(a_desc, b_desc, c_desc, c_ptr, tile, tiles_m, tiles_n, K, BM: tl.constexpr, BN: tl.constexpr,
                BK: tl.constexpr, GROUP_M: tl.constexpr, EPI: tl.constexpr, SUBTILE: tl.constexpr = False):
    per_group = GROUP_M * tiles_n
    first_m = (tile // per_group) * GROUP_M
    rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (tile % per_group) % rows
    pid_n = (tile % per_group) // rows
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        acc = tl.dot(a_desc.load([pid_m * BM, k * BK]), b_desc.load([k * BK, pid_n * BN]), acc)
    if SUBTILE:  # the epilogue in two [BM, BN/2] halves: the first half's store overlaps the second's maths
        halves = tl.permute(tl.reshape(acc, (BM, 2, BN // 2)), (0, 2, 1))
        acc0, acc1 = tl.split(halves)
        c_desc.store([pid_m * BM, pid_n * BN], _epilogue(acc0, EPI).to(c_ptr.dtype.element_ty))
        c_desc.store([pid_m * BM, pid_n * BN + BN // 2], _epilogue(acc1, EPI).to(c_ptr.dtype.element_ty))
    else:
        acc = _epilogue(acc, EPI)
        c_desc.store([pid_m * BM, pid_n * BN], acc.to(c_ptr.dtype.element_ty))


@triton.jit
def persistent_gemm(a_ptr, b_ptr, c_ptr, ticket_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                    GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, WS: tl.constexpr, EPI: tl.constexpr,
                    TICKET: tl.constexpr = False, WHILE: tl.constexpr = False, TICKET_FOR: tl.constexpr = False,
                    SUBTILE: tl.constexpr = False, FLATTEN: tl.constexpr = False, GUARDED: tl.constexpr = False,
                    TICKET_STATIC: tl.constexpr = False):
    """C = act(A @ B) (EPI: EPILOGUES), tiles in groups of GROUP_M row blocks, column by column.
    ``TICKET``: tiles drawn from an atomic counter in a while loop (as the mm_rs kernel does) instead
    of a static ``for`` over this program's tiles; ``WHILE``: the static tiles in a while loop (no
    atomic: which of the two costs); ``TICKET_FOR``: ticket draws in a ``for`` loop of the even share
    of tiles plus one, each iteration guarded, then a while loop for what is left. ``SUBTILE``: the
    epilogue and store in two column halves; ``FLATTEN``: the static tile loop and the K-loop flattened
    into one (``tl.range(flatten=True)``: the pipeliner may prefetch the next tile's first K-steps
    during this tile's epilogue). ``GUARDED``: static tiles in ``TICKET_FOR``'s loop form (a ``for`` of
    the even share plus one, each iteration guarded: the loop form without the atomic);
    ``TICKET_STATIC``: static tiles, each one's index made to depend on an atomic draw (the atomic's
    round trip without the ticket's order; its own counter, never reset: 2**31 draws are far off)."""
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN // (2 if SUBTILE else 1)])
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    if TICKET:
        tile = tl.atomic_add(ticket_ptr, 1, sem="relaxed", scope="gpu")
        while tile < tiles_m * tiles_n:
            _plain_tile(a_desc, b_desc, c_desc, c_ptr, tile, tiles_m, tiles_n, K, BM, BN, BK, GROUP_M, EPI)
            tile = tl.atomic_add(ticket_ptr, 1, sem="relaxed", scope="gpu")
        if tile == tiles_m * tiles_n + tl.num_programs(0) - 1:
            tl.atomic_xchg(ticket_ptr, 0, sem="relaxed", scope="gpu")
    elif TICKET_FOR:
        n = tiles_m * tiles_n
        tile = tl.atomic_add(ticket_ptr, 1, sem="relaxed", scope="gpu")
        for _ in range(0, tl.cdiv(n, tl.num_programs(0)) + 1):
            if tile < n:
                _plain_tile(a_desc, b_desc, c_desc, c_ptr, tile, tiles_m, tiles_n, K, BM, BN, BK, GROUP_M, EPI)
                tile = tl.atomic_add(ticket_ptr, 1, sem="relaxed", scope="gpu")
        while tile < n:  # tiles left by programs that started late
            _plain_tile(a_desc, b_desc, c_desc, c_ptr, tile, tiles_m, tiles_n, K, BM, BN, BK, GROUP_M, EPI)
            tile = tl.atomic_add(ticket_ptr, 1, sem="relaxed", scope="gpu")
        if tile == n + tl.num_programs(0) - 1:
            tl.atomic_xchg(ticket_ptr, 0, sem="relaxed", scope="gpu")
    elif GUARDED or TICKET_STATIC:
        n = tiles_m * tiles_n
        for i in range(0, tl.cdiv(n, tl.num_programs(0)) + 1):
            tile = tl.program_id(0) + i * tl.num_programs(0)
            if TICKET_STATIC:  # a draw is never >= 2**31: the shift adds 0, but the index waits for the atomic
                tile += tl.atomic_add(ticket_ptr, 1, sem="relaxed", scope="gpu") >> 31
            if tile < n:
                _plain_tile(a_desc, b_desc, c_desc, c_ptr, tile, tiles_m, tiles_n, K, BM, BN, BK, GROUP_M, EPI)
    elif WHILE:
        tile = tl.program_id(0)
        while tile < tiles_m * tiles_n:
            _plain_tile(a_desc, b_desc, c_desc, c_ptr, tile, tiles_m, tiles_n, K, BM, BN, BK, GROUP_M, EPI)
            tile += tl.num_programs(0)
    else:
        for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, NUM_SMS, flatten=FLATTEN, warp_specialize=WS):
            _plain_tile(a_desc, b_desc, c_desc, c_ptr, tile, tiles_m, tiles_n, K, BM, BN, BK, GROUP_M, EPI, SUBTILE)


def _vs_cublas(run, cublas) -> str:
    """``run``'s time and its ratio to ``cublas`` (a callable), their calls alternating
    (``common.paired_queued_ms``: the GPU's clock drifts under a sustained load)."""
    t = paired_queued_ms(run, cublas, n=20, warm=5)
    return f"{t.ms:.3f} ms, {t.ratio:.3f}x cuBLAS (paired; cuBLAS {t.baseline_ms:.3f} ms beside it)"


def _stage0_ms(a, b, ref, num_sms, cublas, tma_store=False) -> str:
    """The op's stage-0 kernel alone on this GPU: A = GELU(a @ b) into a local chunk-major staging
    buffer (the copy-engine transport's), counting tiles per chunk; checked, then timed."""
    from overlap_backend.codegen import cta
    from overlap_backend.runtime import cta_plan

    M, _ = a.shape
    N = b.shape[1]
    cfg0, cfg1 = cta_plan.block_configs(a.dtype, False, M, a.shape[1], num_sms)  # group size as the op (N of stage 1 = H)
    BM, BN = cfg0[0], cfg0[1]
    tiles_m = -(-M // BM)
    kchunk, nch = cta_plan.k_chunks(N, BN, cfg1[2], -(-tiles_m // cfg0[3]), 1)
    mp = tiles_m * BM
    stage = torch.full((nch * mp * kchunk,), float("nan"), device=a.device, dtype=a.dtype)
    counters = torch.zeros(4096, dtype=torch.int32, device=a.device)
    done = torch.zeros(4096, dtype=torch.int32, device=a.device)
    one = torch.ones(1, dtype=torch.int32, device=a.device)
    tables = torch.zeros(8, dtype=torch.int64, device=a.device)  # peer tables: unused by local stores

    def run():
        cta.launch_stage0(a, b, None, None, None, stage, tables, tables, counters, done, one, 0, kchunk, nch, 0,
                          1, 1, cta.ACT_GELU_TANH, cfg0, num_sms, tma_store=tma_store)

    run()
    torch.cuda.synchronize()
    got = stage.view(nch, mp, kchunk)[:, :M].permute(1, 0, 2).reshape(M, nch * kchunk)[:, :N]
    err = ((got.float() - ref).norm() / ref.norm()).item()
    if not err <= 1e-2:
        return f"WRONG (rel err {err:.2e})"
    return f"{_vs_cublas(run, cublas)}, rel err {err:.1e} (config {cfg0}, {nch} chunks of {kchunk})"


def _interleaved_lines(baseline, timed, rounds: int) -> list[str]:
    """Each of ``timed`` ((label, run)) and ``baseline`` (cuBLAS) timed in ``rounds`` interleaved rounds
    (cuBLAS, then every variant, each the median of 20 CUDA-event timings), so that a clock or thermal
    drift over the run falls on every variant alike: per variant the median ms and the median, lowest
    and highest of its per-round ratios to that round's cuBLAS."""
    import statistics

    runs = [("cuBLAS", baseline)] + list(timed)
    ms = {label: [] for label, _ in runs}
    for _ in range(rounds):
        for label, run in runs:
            ms[label].append(events_ms(run, warm=5))
    lines = [f"  interleaved, {rounds} rounds: cuBLAS {statistics.median(ms['cuBLAS']):.3f} ms"]
    for label, _ in timed:
        ratios = [t / c for t, c in zip(ms[label], ms["cuBLAS"])]
        lines.append(f"{label}: {statistics.median(ms[label]):.3f} ms, {statistics.median(ratios):.3f}x cuBLAS "
                     f"(rounds {min(ratios):.3f}-{max(ratios):.3f})")
    return lines


def _first_run_error(run) -> str | None:
    """Run ``run`` once and wait for it: None, or why it failed (e.g. did not compile), in one line.
    A probe reports that and goes on with its next variant."""
    try:
        run()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - reported by the caller
        return f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return None


# --variants: name -> the ``ws`` value of the plain GEMM's loop (False: a static for loop; True: the same,
# warp-specialized; the strings name the other loops and epilogue forms)
LOOP_VARIANTS = {"plain": False, "warp_specialize": True, "ticket": "ticket", "while": "while",
                 "ticket_for": "ticket_for", "guarded": "guarded", "ticket_static": "ticket_static", "subtile": "subtile", "flatten": "flatten",
                 "subtile_flatten": "subtile_flatten"}
PLAIN_CONFIGS = "128x256x64x3x8,128x256x64x4x8,128x128x64x4x8,128x128x64x4x4"


def _parse_configs(text: str) -> list[tuple[int, ...]]:
    return [tuple(int(v) for v in cfg.split("x")) for cfg in text.split(",")]


def _mm_rs_lines(a, b, ws, num_sms, cublas, configs_text=None, residual_add=False) -> list[str]:
    """The mm_rs producer kernel alone on this GPU, as rank 0 of a ``ws``-rank group: ``a`` [M, K] is
    the op's local operand (ws chunks of M/ws rows), every peer's partial already in the receive
    buffer and every flag raised (epoch 0, as the op's tuning runs). Each candidate config
    (pointer stores, and the TMA variants where they apply) is checked (the staged remote chunks,
    the reduced own chunk, outputs poisoned) and timed against cuBLAS's whole [M, K] @ [K, N].
    ``residual_add``: also with the TP block's residual add fused into the own tiles' epilogue (the
    generated ``add:0``) against the same kernel followed by a separate ``torch.add``."""
    from overlap_backend.codegen import configs, mm_rs
    from overlap_backend.codegen import epilogue as gen
    from overlap_backend.spec import symm_layout

    M, _ = a.shape
    N = b.shape[1]
    rows, r = M // ws, 0
    dev = a.device
    recv = torch.randn(ws * rows, N, device=dev).to(a.dtype)  # the peers' partials of chunk r
    ref = a.float() @ b.float()
    want_own = ref[r * rows:(r + 1) * rows] + sum(recv[p * rows:(p + 1) * rows].float() for p in range(ws) if p != r)
    band_rows = symm_layout.band_rows(rows)
    nb = -(-rows // band_rows)
    flags = [torch.zeros(ws * nb, dtype=torch.int32, device=dev) for _ in range(3)]  # counters, done, arrived
    ticket = torch.zeros(1, dtype=torch.int32, device=dev)
    status = (torch.zeros(1, dtype=torch.int32, device=dev), torch.zeros(8, dtype=torch.int32, device=dev))
    lines = []
    cands = configs.candidates(a.dtype, tma_store_rows=rows) if configs_text is None else [
        (BM, BN, BK, 8, stages, warps, tma) for BM, BN, BK, stages, warps in _parse_configs(configs_text)
        for tma in (False, True)]
    for cfg in cands:
        stage = torch.full((ws * rows, N), float("nan"), device=dev, dtype=a.dtype)
        out = torch.full((rows, N), float("nan"), device=dev, dtype=a.dtype)

        def run():
            mm_rs.launch(a, b, None, stage, recv, None, out, *flags, ticket, 0, status, 10**9, r, ws, rows, rows, 1,
                         0, 0, False, band_rows, cfg, num_sms)

        label = f"  mm_rs ws={ws} {cfg}"
        if why := _first_run_error(run):
            lines.append(f"{label}: {why}")
            continue
        err = ((out.float() - want_own).norm() / want_own.norm()).item()
        if ws > 1:  # (ws 1: every tile is the own chunk's, nothing staged)
            err = max(err, ((stage[rows:].float() - ref[rows:]).norm() / ref[rows:].norm()).item())
        if not err <= 1e-2:
            lines.append(f"{label}: WRONG (rel err {err:.2e})")
            continue
        lines.append(f"{label}: {_vs_cublas(run, cublas)}, rel err {err:.1e}")
        if residual_add:
            lines.append(_residual_add_line(a, b, ws, num_sms, cfg, recv, out, want_own, flags, ticket, status,
                                            band_rows, run, gen, mm_rs))
    return lines


def _residual_add_line(a, b, ws, num_sms, cfg, recv, out, want_own, flags, ticket, status, band_rows, run, gen,
                       mm_rs) -> str:
    """The own chunk's residual add fused (``add:0``) vs the plain kernel then ``torch.add``."""
    rows, N = out.shape
    residual = torch.randn(rows, N, device=a.device).to(a.dtype)
    g = gen.build("add:0", a.dtype)
    fused_out = torch.full_like(out, float("nan"))
    stage = torch.empty(ws * rows, N, device=a.device, dtype=a.dtype)
    summed = torch.empty_like(out)

    def fused():
        mm_rs.launch(a, b, None, stage, recv, None, fused_out, *flags, ticket, 0, status, 10**9, 0, ws, rows, rows, 1,
                     0, 0, False, band_rows, cfg, num_sms, epilogue=g, ep_ptrs=gen.pointers(g, [residual]))

    def unfused():
        run()
        torch.add(out, residual, out=summed)

    fused()
    torch.cuda.synchronize()
    want = want_own.to(a.dtype).float() + residual.float()
    err = ((fused_out.float() - want).norm() / want.norm()).item()
    if not err <= 1e-2:
        return f"    + residual add fused: WRONG (rel err {err:.2e})"
    t = paired_queued_ms(fused, unfused, n=20, warm=5)
    return (f"    + residual add: fused {t.ms:.3f} ms, kernel then torch.add {t.baseline_ms:.3f} ms, fused / unfused "
            f"{t.ratio:.3f} (paired; rel err {err:.1e})")


def _ag_mm_lines(a, b, ws, num_sms, cublas, configs_text=None) -> list[str]:
    """The ag_mm consumer kernel alone on this GPU, as rank 0 of a ``ws``-rank group: ``a`` [M, K] is
    the gathered input (its first M/ws rows the own shard, the rest already in the receive buffer,
    every flag raised), plain and with the TP block's fused epilogue (bias, then erf GELU, generated
    by codegen/epilogue.py), against cuBLAS: ``addmm`` alone, and ``addmm`` then ``F.gelu`` (the
    unfused graph's two kernels). Each result checked (outputs poisoned), then timed."""
    from overlap_backend.codegen import ag_mm, configs
    from overlap_backend.codegen import epilogue as gen
    from overlap_backend.spec import symm_layout

    F = torch.nn.functional
    M, K = a.shape
    N = b.shape[1]
    rows, dev = M // ws, a.device
    shard, buf = a[:rows].contiguous(), a.view(ws, rows, K)
    bias = torch.randn(N, device=dev).to(a.dtype)
    ref = a.float() @ b.float() + bias.float()
    refs = {"": ref, "gelu": F.gelu(ref)}
    band_rows = symm_layout.band_rows(rows)
    flags = torch.zeros(ws * -(-rows // band_rows), dtype=torch.int32, device=dev)
    status = (torch.zeros(1, dtype=torch.int32, device=dev), torch.zeros(8, dtype=torch.int32, device=dev))
    lines = [f"  cuBLAS addmm {events_ms(lambda: torch.addmm(bias, a, b), warm=5):.3f} ms, addmm + F.gelu "
             f"{events_ms(lambda: F.gelu(torch.addmm(bias, a, b)), warm=5):.3f} ms"]
    cands = configs.candidates(a.dtype, tma_store_rows=rows) if configs_text is None else [
        (BM, BN, BK, 8, stages, warps, tma) for BM, BN, BK, stages, warps in _parse_configs(configs_text)
        for tma in (False, True)]
    for spec in ("", "gelu"):
        g = gen.build(spec, a.dtype) if spec else None
        for cfg in cands:
            out = torch.full((M, N), float("nan"), device=dev, dtype=a.dtype)

            def run():
                ag_mm.launch(shard, buf, b, bias, out, flags, 0, status, 10**9, 0, ws, rows, band_rows, cfg, num_sms,
                             epilogue=g, ep_ptrs=gen.pointers(g, ()) if g is not None else ())

            label = f"  ag_mm ws={ws} {cfg} epilogue={spec or 'none'}"
            if why := _first_run_error(run):
                lines.append(f"{label}: {why}")
                continue
            want = refs[spec]
            err = ((out.float() - want).norm() / want.norm()).item()
            if not err <= 1e-2:
                lines.append(f"{label}: WRONG (rel err {err:.2e})")
                continue
            lines.append(f"{label}: {_vs_cublas(run, cublas)} mm, rel err {err:.1e}")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="1024x8192x28672,512x8192x28672,1024x28672x8192",
                   help="MxKxN, comma-separated (default: the CTA op's GEMMs at M=1024 and 512)")
    p.add_argument("--configs", default=None,
                   help="BMxBNxBKxSTAGESxWARPS[xCTAS], comma-separated (default: " + PLAIN_CONFIGS + "; CTAS: the plain "
                        "GEMM launched in clusters of that many CTAs, num_ctas; with --mm-rs: the op's tuning "
                        "candidates, else these, each with and without TMA)")
    p.add_argument("--gelu", action="store_true", help="also the op's GELU epilogue (= --epilogues none,gelu)")
    p.add_argument("--epilogues", default=None,
                   help=f"activation variants of the plain GEMM, comma-separated from {', '.join(EPILOGUES)} "
                        "(default: none)")
    p.add_argument("--no-ws", action="store_true", help="only warp_specialize=False")
    p.add_argument("--variants", default=None,
                   help="the plain GEMM's loop variants, comma-separated from " + ", ".join(LOOP_VARIANTS) +
                        " (default: all but subtile / flatten; --no-ws: plain only)")
    p.add_argument("--rounds", type=int, default=1,
                   help="the plain GEMM's variants and cuBLAS timed in this many interleaved rounds (median ratio "
                        "and range per variant; default 1: each variant timed once, in turn)")
    p.add_argument("--stage0", action="store_true",
                   help="also the CTA op's stage-0 kernel (GELU, chunk-major local stores, tiles counted; "
                        "flags local) at each MxKxN, in its default config")
    p.add_argument("--mm-rs", default=None, metavar="WS,...",
                   help="also the mm_rs producer kernel alone (rank 0 of each group size; flags raised, partials "
                        "local) at each MxKxN (the op's local problem), every candidate config, then stop")
    p.add_argument("--rs-residual-add", action="store_true",
                   help="with --mm-rs: also each config with the residual add fused into its epilogue, against "
                        "the kernel then a separate torch.add")
    p.add_argument("--ag-mm", default=None, metavar="WS,...",
                   help="also the ag_mm consumer kernel alone (rank 0 of each group size; shards local, flags "
                        "raised) at each MxKxN (M: gathered rows), plain and with the TP block's bias + GELU "
                        "epilogue fused, against cuBLAS addmm (+ F.gelu), then stop")
    args = p.parse_args()
    names = (args.variants.split(",") if args.variants else
             ["plain"] if args.no_ws else ["plain", "warp_specialize", "ticket", "while", "ticket_for"])
    for name in names:
        if name not in LOOP_VARIANTS:
            p.error(f"--variants: {name!r} is not one of {', '.join(LOOP_VARIANTS)}")
    variants = [LOOP_VARIANTS[name] for name in names]
    dev = torch.device("cuda")
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))
    num_sms = torch.cuda.get_device_properties(dev).multi_processor_count
    epilogues = (args.epilogues or ("none,gelu" if args.gelu else "none")).split(",")
    for epi in epilogues:
        if epi not in EPILOGUES:
            p.error(f"--epilogues: {epi!r} is not one of {', '.join(EPILOGUES)}")
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}, triton {triton.__version__}, {num_sms} SMs",
          flush=True)
    ticket = torch.zeros(1, dtype=torch.int32, device=dev)  # the TICKET variant's tile counter (0 between calls)
    draws = torch.zeros(1, dtype=torch.int32, device=dev)  # the TICKET_STATIC variant's counter (never reset)
    for shape in args.shapes.split(","):
        M, K, N = (int(v) for v in shape.split("x"))
        a = torch.randn(M, K, device=dev).to(torch.bfloat16)
        b = (torch.randn(K, N, device=dev) / K**0.5).to(torch.bfloat16)
        ref = a.float() @ b.float()
        gelu_ref = torch.nn.functional.gelu(ref, approximate="tanh")
        cublas = lambda a=a, b=b: torch.mm(a, b)  # noqa: E731 - every kernel is timed call by call against it
        print(f"M={M} K={K} N={N}: cuBLAS {events_ms(cublas, warm=5):.3f} ms (alone)", flush=True)
        if args.ag_mm:
            for ws in (int(w) for w in args.ag_mm.split(",")):
                for line in _ag_mm_lines(a, b, ws, num_sms, cublas, args.configs):
                    print(line, flush=True)
            continue
        if args.mm_rs:
            for ws in (int(w) for w in args.mm_rs.split(",")):
                for line in _mm_rs_lines(a, b, ws, num_sms, cublas, args.configs, args.rs_residual_add):
                    print(line, flush=True)
            continue
        if args.stage0:
            for tma in (False, True):
                print(f"  stage0 (cta.launch_stage0, tma_store={tma}): {_stage0_ms(a, b, gelu_ref, num_sms, cublas, tma)}",
                      flush=True)
        timed = []  # (label, run) of every variant that compiled and checked: timed below
        for cfg in (args.configs or PLAIN_CONFIGS).split(","):
            BM, BN, BK, stages, warps, *ctas = (int(v) for v in cfg.split("x"))  # [xCTAS]: a cluster of CTAs
            for epi in epilogues:
                expected = _reference(ref, epi)
                for ws in variants:
                    c = torch.full((M, N), float("nan"), device=dev, dtype=torch.bfloat16)
                    # a program is a cluster of num_ctas CTAs sharing one tile: a cluster per num_ctas SMs
                    grid = (min(num_sms // (ctas[0] if ctas else 1), triton.cdiv(M, BM) * triton.cdiv(N, BN)),)

                    def run(c=c, grid=grid, BM=BM, BN=BN, BK=BK, stages=stages, warps=warps, ctas=ctas, epi=epi,
                            ws=ws):
                        persistent_gemm[grid](a, b, c, draws if ws == "ticket_static" else ticket, M, N, K, BM=BM,
                                              BN=BN, BK=BK, GROUP_M=8, NUM_SMS=grid[0], WS=ws is True,
                                              EPI=EPILOGUES[epi], TICKET=ws == "ticket", WHILE=ws == "while",
                                              TICKET_FOR=ws == "ticket_for", SUBTILE="subtile" in str(ws),
                                              FLATTEN="flatten" in str(ws), GUARDED=ws == "guarded",
                                              TICKET_STATIC=ws == "ticket_static", num_stages=stages,
                                              num_warps=warps, **({"num_ctas": ctas[0]} if ctas else {}))

                    label = f"  {cfg} {epi} ws={ws}"
                    if why := _first_run_error(run):
                        print(f"{label}: {why}", flush=True)
                        continue
                    err = ((c.float() - expected).norm() / expected.norm()).item()
                    worst = (c.float() - expected).abs().max().item()
                    if not err <= 1e-2:
                        print(f"{label}: WRONG (rel err {err:.2e})", flush=True)
                        continue
                    if args.rounds > 1:
                        timed.append((label, run))
                        continue
                    print(f"{label}: {_vs_cublas(run, cublas)}, rel err {err:.1e}, max abs err {worst:.1e}",
                          flush=True)
        if timed:
            for line in _interleaved_lines(cublas, timed, args.rounds):
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
