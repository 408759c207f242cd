"""Probe of the symm lowering's parts on N GPUs (explains the benchmark's numbers; not a test).

    torchrun --nproc-per-node=N bench/probes/probe_symm.py [--quick] [--ops ag_mm,mm_rs,mm_ar,host]

Per shape of the baseline tables (docs/results.md), bf16, CUDA events, median of 30 after warm-up, max over ranks:

- ``kernel/cuBLAS``: our tile kernel with every flag already raised (no communication) vs
  ``torch.mm`` on the same problem: how close the persistent TMA GEMM is to cuBLAS;
- ``push GB/s``: the copy-engine pushes of one call alone (bytes received per rank / time);
- ``op``: the whole symm op, and ``max(mm, NCCL)`` for reference.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.tools import common  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import overlap_backend  # noqa: E402,F401
from overlap_backend.runtime import symm  # noqa: E402
from overlap_backend.runtime.symm import ag_mm as symm_ag_mm  # noqa: E402
from overlap_backend.runtime.symm import lowering_helpers  # noqa: E402
from overlap_backend.runtime.symm import mm_ar as symm_mm_ar  # noqa: E402
from overlap_backend.runtime.symm import mm_rs as symm_mm_rs  # noqa: E402
from overlap_backend.spec import knobs, symm_layout  # noqa: E402
from overlap_backend.codegen import configs  # noqa: E402


def med_ms(fn, n=30, warm=5):
    return common.together_ms(fn, n, warm)


def b2b_ms(fn):
    """Back-to-back calls (the host runs ahead, as in a model): median per call, max over ranks."""
    return TIMING.bench(fn)[0]


def replay_ms(fn):
    """``fn`` captured in a CUDA graph (after eager warm-up), replayed back to back: the GPU time of
    a call without its host time."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return b2b_ms(graph.replay)


def host_us(fn, n=20):
    """Host time per call (no synchronisation), median of 3 bursts, max over ranks."""
    return common.host_us(fn, torch.device("cuda", torch.cuda.current_device()), calls=n, rounds=3)


TIMING = None


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    """"MxKxN,MxKxN" -> [(M, K, N), ...] (a fourth number: ag_mm's weight count)"""
    return [tuple(int(v) for v in item.split("x")) for item in text.split(",") if item.strip()]


def with_setting(name, value, fn):
    """Run ``fn`` with the knob ``knobs.symm.<name>`` set to ``value`` (TRANSPORT: how mm_rs / mm_ar ship
    partials, "ce" or "peer"; MM_RS_GEMM: "cublas" or "triton"; RS_CUBLAS_BAND_FLOPS), or with the path
    decision ``ag_gemm`` (ag_mm's) or ``rs_gemm`` (mm_rs's) replaced by ``value``."""
    if name not in ("ag_gemm", "rs_gemm"):
        with knobs.symm.patch(**{name: value}):
            return fn()
    module = symm_ag_mm if name == "ag_gemm" else symm_mm_rs
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        return fn()
    finally:
        setattr(module, name, saved)


def main():
    global TIMING
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--ops", default="ag_mm,mm_rs,mm_ar,host", help="which parts to probe (comma-separated)")
    p.add_argument("--rs-shapes", default="", help="mm_rs shapes MxKxN (K: the whole contraction, split ws ways), "
                   "comma-separated, instead of the baseline tables'; e.g. 2048x3584x8192 at ws 2 has ws 4's local problem "
                   "of 4096x7168x8192 (local K 1792, 1024 rows per chunk)")
    p.add_argument("--ag-shapes", default="", help="ag_mm shapes MxKxN[xW] (M gathered rows; W weights of N/W "
                   "columns each, default 1), comma-separated, instead of the baseline tables'")
    p.add_argument("--ar-shapes", default="", help="mm_ar shapes MxKxN (K local), comma-separated, instead of the baseline tables'")
    common.add_set_argument(p)
    args = common.parse_args_with_sets(p)
    ops = set(args.ops.split(","))
    rank, ws, device = common.init_distributed("cuda")
    TIMING = common.Timing(device)
    gn = common.group_name()
    dt = torch.bfloat16
    ag_shapes = [(4096, 8192, 7168), (8192, 8192, 7168), (16384, 8192, 2048), (512, 8192, 7168)]
    rs_shapes = [(4096, 7168, 8192), (8192, 7168, 8192), (16384, 2048, 8192), (512, 7168, 8192)]
    ar_shapes = [(128, 7168, 8192), (1024, 7168, 8192), (4096, 7168, 8192), (8192, 7168, 8192)]
    if args.quick:
        ag_shapes, rs_shapes, ar_shapes = ag_shapes[:1], rs_shapes[:1], ar_shapes[:2]
    ag_shapes = parse_shapes(args.ag_shapes) or ag_shapes
    rs_shapes = parse_shapes(args.rs_shapes) or rs_shapes
    ar_shapes = parse_shapes(args.ar_shapes) or ar_shapes
    ag_shapes, rs_shapes, ar_shapes = [s if op in ops else [] for op, s in
                                       (("ag_mm", ag_shapes), ("mm_rs", rs_shapes), ("mm_ar", ar_shapes))]
    lines = [f"probe_symm ws={ws} {torch.cuda.get_device_name()} torch {torch.__version__}"]
    ag_kernel, rs_kernel, _, _ = lowering_helpers.load_kernels()
    claim = torch.zeros(1, dtype=torch.int32, device=device)
    report = torch.zeros(8, dtype=torch.int32, device=device)
    nsm = torch.cuda.get_device_properties(device).multi_processor_count

    for M, K, N, *nw in ag_shapes:
        nw = nw[0] if nw else 1
        rows = M // ws
        shard = torch.randn(rows, K, device=device, dtype=dt)
        ws_ = [(torch.randn(N // nw, K, device=device, dtype=dt) * K**-0.5).t() for _ in range(nw)]  # nn.Linear layout
        w = ws_[0]
        G = torch.randn(M, K, device=device, dtype=dt)
        buf = G.view(ws, rows, K)
        out = torch.empty(M, N // nw, device=device, dtype=dt)
        flags = torch.zeros(ws * symm_layout.MAX_BANDS, dtype=torch.int32, device=device)
        cfg_times = {}
        for cfg in configs.candidates(dt):
            cfg_times[cfg] = med_ms(lambda cfg=cfg: ag_kernel.launch(shard, buf, w, None, out, flags, 0, (claim, report),
                                                                     10**9, rank, ws, rows, symm_layout.band_rows(rows), cfg,
                                                                     nsm), n=10)
        best = min(cfg_times, key=cfg_times.get)
        t_kernel = cfg_times[best] * nw
        t_mm = med_ms(lambda: [torch.mm(G, x) for x in ws_])
        flat = torch.empty(M, K, device=device, dtype=dt)
        t_ag = med_ms(lambda: dist.all_gather_into_tensor(flat, shard))
        op = lambda: torch.ops.overlap.ag_mm(shard, ws_, [None] * nw, 0, gn, "symm", False)  # noqa: E731
        t_op = med_ms(op)
        t_b2b, t_host = b2b_ms(op), host_us(op)
        gemm = symm_ag_mm.ag_gemm(1, rows, K, N)
        # both GEMM paths forced (symm_ag_mm.ag_gemm): eager back to back, host time, CUDA-graph replays
        path = {g: with_setting("ag_gemm", lambda *a, g=g, **k: g, lambda: (b2b_ms(op), host_us(op), replay_ms(op)))
                for g in ("triton", "cublas")}
        st = symm.state(gn, device)
        chunk = rows * K * 2

        def pushes():
            compute = torch.cuda.current_stream()
            st.begin(compute)
            for j in range(ws - 1):
                st.push((rank - 1 - j) % ws, rank * chunk, shard.data_ptr(), chunk, symm_layout.AG_ARRIVED + rank)
            st.end(compute)

        t_push = med_ms(pushes)
        lines.append(
            f"ag_mm M={M} K={K} N={N} ({nw} weight(s)): kernel {t_kernel:.3f} ({best}) cuBLAS {t_mm:.3f} ratio "
            f"{t_kernel / t_mm:.2f} | NCCL ag {t_ag:.3f} CE push {t_push:.3f} ({(ws - 1) * chunk / t_push / 1e6:.0f} GB/s "
            f"recv) | op {t_op:.3f} (back-to-back {t_b2b:.3f}, host {t_host:.0f} us; {gemm}) max(mm,ag) "
            f"{max(t_mm, t_ag):.3f} -> {t_b2b / max(t_mm, t_ag):.2f}x | " + " | ".join(
                f"{g} path: back-to-back {b:.3f} host {h:.0f} us replayed {rp:.3f} ({rp / max(t_mm, t_ag):.2f}x)"
                for g, (b, h, rp) in path.items())
            + f" | configs {', '.join(f'{c[:2]}/{c[4]}st/{c[5]}w {t:.3f}' for c, t in cfg_times.items())}"
        )
        print(lines[-1], flush=True) if rank == 0 else None

    for M, K, N in rs_shapes:
        a = torch.randn(M, K // ws, device=device, dtype=dt)
        b = (torch.randn(N, K // ws, device=device, dtype=dt) * (K / ws) ** -0.5).t()
        t_mm = med_ms(lambda: torch.mm(a, b))
        c = torch.mm(a, b)
        o = torch.empty(M // ws, N, device=device, dtype=dt)
        t_rs = med_ms(lambda: dist.reduce_scatter_tensor(o, c))
        op = lambda: torch.ops.overlap.mm_rs(a, b, None, [M, N], 0, "sum", gn, "symm")  # noqa: E731
        t_op, t_b2b, t_host = med_ms(op), b2b_ms(op), host_us(op)
        t_peer = with_setting("TRANSPORT", "peer", lambda: b2b_ms(op))
        t_kernel_op = with_setting("MM_RS_GEMM", "triton", lambda: b2b_ms(op))
        gemm = symm_mm_rs.rs_gemm(1, M // ws, K // ws)
        # the cuBLAS path by band size (RS_CUBLAS_BAND_FLOPS; 1e15: one band per chunk): eager back to
        # back, host time per call, and captured in a CUDA graph, replayed back to back (GPU time);
        # the kernel path replayed before and after (the spread is the noise)
        kernel_replay = lambda: with_setting("rs_gemm", lambda *a, **k: "triton", lambda: replay_ms(op))  # noqa: E731
        cublas_replay = lambda: with_setting("rs_gemm", lambda *a, **k: "cublas", lambda: replay_ms(op))  # noqa: E731
        t_kernel_replay = kernel_replay()
        cublas_eager = lambda: with_setting("rs_gemm", lambda *a, **k: "cublas",  # noqa: E731
                                            lambda: (b2b_ms(op), host_us(op)))
        by_band = {f: with_setting("RS_CUBLAS_BAND_FLOPS", f, lambda: (
                       len(symm_mm_rs.rs_cublas_bands(1, M // ws, K // ws, N)), *cublas_eager()))
                   for f in (0, 16e9, 64e9, 1e15)}
        by_graph_band = {f: with_setting("RS_CUBLAS_BAND_FLOPS_CAPTURED", f, lambda: (
                             len(symm_mm_rs.rs_cublas_bands(1, M // ws, K // ws, N, captured=True)),
                             cublas_replay()))
                         for f in (0, 16e9, 32e9, 64e9, 1e15)}
        t_kernel_replay2 = kernel_replay()
        rows = M // ws
        stage = torch.empty(M, N, device=device, dtype=dt)
        recv = torch.randn(M, N, device=device, dtype=dt)
        outk = torch.empty(rows, N, device=device, dtype=dt)
        zeros = [torch.zeros(ws * symm_layout.MAX_BANDS, dtype=torch.int32, device=device) for _ in range(3)]
        ticket = torch.zeros(1, dtype=torch.int32, device=device)
        kt = {}
        for cfg in configs.candidates(dt):
            kt[cfg] = med_ms(lambda cfg=cfg: rs_kernel.launch(a, b, None, stage, recv, None, outk, zeros[0], zeros[1],
                                                            zeros[2], ticket, 0, (claim, report), 10**9, rank, ws,
                                                            rows, rows, 1, 0, 0, False, symm_layout.band_rows(rows), cfg,
                                                            nsm), n=10)
        best = min(kt, key=kt.get)
        lines.append(f"mm_rs M={M} K={K} N={N}: cuBLAS {t_mm:.3f} NCCL rs {t_rs:.3f} kernel {kt[best]:.3f} ({best}) "
                     f"ratio {kt[best] / t_mm:.2f} | op {t_op:.3f} (back-to-back {t_b2b:.3f}, host {t_host:.0f} us) "
                     f"-> {t_b2b / max(t_mm, t_rs):.2f}x of max ({gemm}) | Triton-kernel path {t_kernel_op:.3f} | "
                     f"peer-store transport {t_peer:.3f} | Triton-kernel path replayed {t_kernel_replay:.3f} / "
                     f"{t_kernel_replay2:.3f} | cuBLAS path eager, by band GFLOP: " + ", ".join(
                         f"{f / 1e9:g}: {nb} bands {t:.3f} ms host {h:.0f} us" for f, (nb, t, h) in by_band.items())
                     + " | cuBLAS path replayed, by band GFLOP: " + ", ".join(
                         f"{f / 1e9:g}: {nb} bands {t:.3f}" for f, (nb, t) in by_graph_band.items()))
        print(lines[-1], flush=True) if rank == 0 else None

    for M, K, N in ar_shapes:
        a = torch.randn(M, K, device=device, dtype=dt)
        b = (torch.randn(N, K, device=device, dtype=dt) * K**-0.5).t()
        t_mm = med_ms(lambda: torch.mm(a, b))
        c = torch.mm(a, b)
        t_ar = med_ms(lambda: dist.all_reduce(c))
        op = lambda: torch.ops.overlap.mm_ar(a, b, None, "sum", gn, "symm")  # noqa: E731
        t_op, t_b2b, t_host = med_ms(op), b2b_ms(op), host_us(op)
        t_peer = with_setting("TRANSPORT", "peer", lambda: b2b_ms(op))
        t_kernel_op = with_setting("MM_RS_GEMM", "triton", lambda: (b2b_ms(op), host_us(op)))
        # the cuBLAS rounds forced (ar_gemm takes the kernel wherever it would run several rounds),
        # eager back to back and captured (replayed), beside the kernel path replayed
        force_cublas = lambda fn: with_setting("ar_gemm", lambda *a, **k: "cublas", fn)  # noqa: E731
        cublas_rounds = {f: with_setting("RS_CUBLAS_BAND_FLOPS", f, lambda: force_cublas(lambda: (
                             symm_mm_ar.ar_cublas_rounds(M, K, N, ws), b2b_ms(op), host_us(op), replay_ms(op))))
                         for f in (16e9, 32e9, 64e9, 128e9)}
        t_kernel_replay = with_setting("ar_gemm", lambda *a, **k: "triton", lambda: replay_ms(op))
        gemm = symm_mm_ar.ar_gemm(M, K, ws)
        lines.append(f"mm_ar M={M} K={K} N={N}: cuBLAS {t_mm:.3f} NCCL ar {t_ar:.3f} op {t_op:.3f} "
                     f"(back-to-back {t_b2b:.3f}, host {t_host:.0f} us) -> {t_b2b / max(t_mm, t_ar):.2f}x of max "
                     f"({gemm}) | peer-store transport {t_peer:.3f} | Triton-kernel path (rounds "
                     f"{symm_mm_ar.ar_rounds(M, ws)}) {t_kernel_op[0]:.3f} host {t_kernel_op[1]:.0f} us, replayed "
                     f"{t_kernel_replay:.3f} | cuBLAS path by GFLOP per chunk (eager, host, replayed): " + ", ".join(
                         f"{f / 1e9:g}: {n} rounds {t:.3f} ms host {h:.0f} us replayed {tr:.3f}"
                         for f, (n, t, h, tr) in cublas_rounds.items()))
        print(lines[-1], flush=True) if rank == 0 else None
    if "host" not in ops:
        common.shutdown()
        return
    # Where the host time of a decode-size call goes (rank 0's profile).
    import cProfile
    import pstats

    a = torch.randn(512, 8192, device=device, dtype=dt)
    b = (torch.randn(8192, 8192, device=device, dtype=dt) * 8192**-0.5).t()
    shard = torch.randn(512 // ws, 8192, device=device, dtype=dt)
    a_big = torch.randn(4096, 3584, device=device, dtype=dt)
    b_big = (torch.randn(8192, 3584, device=device, dtype=dt) * 3584**-0.5).t()
    calls = [lambda: torch.ops.overlap.ag_mm(shard, [b], [None], 0, gn, "symm", False),
             lambda: torch.ops.overlap.mm_rs(a, b, None, [512, 8192], 0, "sum", gn, "symm"),
             lambda: torch.ops.overlap.mm_rs(a_big, b_big, None, [4096, 8192], 0, "sum", gn, "symm")]
    for c in calls:
        c()
    torch.cuda.synchronize()
    prof = cProfile.Profile() if rank == 0 else None
    if prof:
        prof.enable()
    for _ in range(50):
        for c in calls:
            c()
    if prof:
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
    common.shutdown()


if __name__ == "__main__":
    main()
