"""Probe of the CTA-pipelining op on 2 GPUs: where does the time of one call go?

Measures, per M (GELU MLP, H=8192, F=28672 by default, bf16): the whole op; each kernel alone with
its flags already raised (stage 0 on rank 0, stage 1 on rank 1, the collect on rank 0); the same
op without the stream-level READY waits (unsafe, measurement only); and the round-trip latency of
a flag written by one GPU's stream (``cuStreamWriteValue32`` into the peer's memory) and awaited by
the other's (``cuStreamWaitValue32``). Not a benchmark of record: a diagnostic.

    torchrun --nproc-per-node=2 bench/probes/probe_cta.py [--sizes 512,4096] [--stage0-variants group8,stages4]
        [--op-variants late,k8] [--profile]

``--stage0-variants`` / ``--stage1-variants`` time stage 0 / stage 1 alone in other block configs
(``stages4``, ``bk128+stages2``, ...), ``--op-variants`` the whole op
with other ``knobs.cta`` settings (same process, so comparable with the defaults: machines differ
by up to 15 % in the same kernel's time). ``--profile`` prints a cProfile of 20 eager calls per M on
each rank (functions by own time); ``--host-breakdown`` the host time of each step of a call, with
Triton's launch path and with ``codegen.launcher``'s fast path (and the op's time with each);
``--gpu-bound`` the GPU time per call of the op (and of TP2) with calls queued behind a GPU sleep.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import overlap_backend  # noqa: E402,F401
from overlap_backend.spec import knobs  # noqa: E402
from bench.tools import common  # noqa: E402


# op variants that switch a boolean knobs.cta setting on ("tma") or off ("notma")
_SWITCHES = {"tma": "STAGE0_TMA_STORE", "split": "STAGE0_SPLIT_LAST", "shipfirst": "SHIP_BEFORE_TAILS"}


def _variant_knobs(variant) -> dict:
    """The ``knobs.cta`` values of an op variant (its parts joined by '+')."""
    values = {}
    for part in variant.split("+"):
        if part in ("first", "late"):
            values["COUNT_FIRST_GROUP_AT_ONCE"] = part == "first"
        elif part.startswith("k"):
            values["K_CHUNKS"] = int(part[1:])
        elif part == "noshare":
            values["GELU_FILL_SHARE"] = False
        elif part.startswith("share"):
            values["GELU_SHARE_COLS"] = int(part[5:])
        elif part.startswith("smax"):  # a wider share window (a new placement)
            values["GELU_SHARE_MAX"] = float(part[4:])
        elif part.startswith("tmax"):  # a wider tail window (a new placement)
            values["TAIL_MAX"] = float(part[4:])
        elif part == "s0bn128":  # GELU's stage 0 in 128x128 tiles (finer waves at small M)
            values["STAGE0_CONFIG"] = (128, 128, 64, 0, 3, 8)
        elif part == "notail":
            values["STAGE0_TAIL"] = False
        elif part == "nogrouptail":  # tails with one row group only (as before MULTI_GROUP_TAIL)
            values["MULTI_GROUP_TAIL"] = False
        elif part.removeprefix("no") in _SWITCHES:  # a boolean setting on, or off with "no"
            values[_SWITCHES[part.removeprefix("no")]] = not part.startswith("no")
        elif part.startswith("tail"):
            values["TAIL_COLS"] = int(part[4:])
        else:
            raise SystemExit(f"unknown op variant {part!r}")
    return values


def _op_variant(variant, timing, op, queued=20):
    """The op (ce transport) timed with the knobs.cta settings of ``variant``, then the defaults back
    (``timing`` None: GPU-bound, ``gpu_bound_ms`` of ``queued`` calls)."""
    from overlap_backend.spec import knobs

    with knobs.cta.patch(**_variant_knobs(variant)):
        op()  # the variant's first call lays out and compiles
        return timing.bench(op)[0] if timing is not None else gpu_bound_ms(op, queued)


def _variant_config(cfg, variant):
    """(``cfg`` (BM, BN, BK, GROUP_M, stages, warps) with the parts of ``variant`` joined by '+':
    stagesN, bmN, bnN, bkN, groupN, warpsN; persistent CTAs per SM (occN, default 1)). "first"
    (stage 0's counting order) is not a config part."""
    fields = {"bm": 0, "bn": 1, "bk": 2, "group": 3, "stages": 4, "warps": 5}
    cfg, occ = list(cfg), 1
    for part in variant.split("+"):
        if part == "first":
            continue
        name = part.rstrip("0123456789")
        if name == "occ" and name != part:
            occ = int(part[3:])
        elif name in fields and name != part:
            cfg[fields[name]] = int(part[len(name):])
        else:
            raise SystemExit(f"unknown config variant {part!r} (stagesN, bmN, bnN, bkN, groupN, warpsN, occN, first)")
    return tuple(cfg), occ


def _stage0_variant(variant, st, placed, x, Fd, cfg0, cfg1, counters, done, one):
    """Stage 0 alone (local stores, flags pre-raised) in a variant of its block config: ms, or the
    error's name if it does not compile."""
    from overlap_backend.codegen import cta
    from overlap_backend.runtime import cta_plan, symm
    from overlap_backend.spec import symm_layout

    cfg, occ = _variant_config(cfg0, variant)
    BM, BN, GROUP_M = cfg[0], cfg[1], cfg[3]
    tiles_m = -(-x.shape[0] // BM)
    kchunk, nch = cta_plan.k_chunks(Fd, BN, cfg1[2], -(-tiles_m // GROUP_M), 1)
    staging = torch.empty(nch * tiles_m * BM * kchunk, dtype=x.dtype, device=x.device)
    data, flags = st.peer_tables()
    try:
        return round(common.events_ms(lambda: cta.launch_stage0(
            x, placed.w1, None, None, None, staging, data, flags, counters, done, one, 0, kchunk, nch,
            symm_layout.cta_block(False) + symm_layout.CTA_ARRIVED, 1, 1, cta.ACT_GELU_TANH, cfg, st.num_sms * occ,
            count_first_at_once="first" in variant.split("+"))), 3)
    except Exception as e:  # noqa: BLE001 - a probe reports what did not compile and goes on
        return f"{type(e).__name__}: {str(e)[:80]}"


def _stage1_variant(variant, st, placed, M, Fd, cfg0, cfg1, out, y_offset, one):
    """Stage 1 alone (every chunk flag already raised) in a variant of its block config: ms, or the
    error's name. Reads whatever the staging area holds (timing only)."""
    from overlap_backend.codegen import cta
    from overlap_backend.runtime import cta_plan, symm
    from overlap_backend.spec import symm_layout

    cfg, occ = _variant_config(cfg1, variant)
    tiles_m = -(-M // cfg[0])
    mp = tiles_m * cfg[0]
    kchunk, nch = cta_plan.k_chunks(Fd, cfg0[1], cfg[2], -(-tiles_m // cfg[3]), 1)
    if nch * mp * kchunk * out.element_size() > y_offset:
        return "does not fit the staging area"
    a = st.data_view(out.dtype, (nch * mp, kchunk))
    data, flags = st.peer_tables()
    B = symm_layout.cta_block(False)
    try:
        return round(common.events_ms(lambda: cta.launch_stage1(
            a, placed.w2, None, out, data, flags, y_offset, st.flag_arg(B + symm_layout.CTA_ARRIVED),
            torch.zeros(tiles_m, dtype=torch.int32, device=out.device), one, st.status_arg(), st.timeout_ns, 1, 2, M,
            Fd, 0, kchunk, nch, B + symm_layout.CTA_Y_DONE, 1, cfg, st.num_sms * occ)), 3)
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {str(e)[:80]}"


def gpu_bound_ms(fn, n=20, sleep_cycles=120_000_000):
    """Time per call of ``n`` calls queued behind a GPU sleep (~60 ms) that outlasts their host
    enqueue: the GPU runs them back to back, so this is the op's GPU time without the host's pace
    (eager calls at small M are host-bound). Collective: every rank calls it at once."""
    torch.cuda.synchronize()
    dist.barrier()
    before, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    before.record()
    torch.cuda._sleep(sleep_cycles)
    t = time.perf_counter()
    # One call before the start event lines the ranks' streams up (the op and the all-reduce wait
    # for their peers): the sleeps end up to the barrier's skew apart, which the first timed call
    # would otherwise absorb on the earlier rank (0.58 vs 0.45 ms per call at M=512, rank 0 vs 1).
    fn()
    start.record()
    for _ in range(n):
        fn()
    enqueue_ms = (time.perf_counter() - t) * 1e3
    end.record()
    torch.cuda.synchronize()
    gpu = start.elapsed_time(end) / n
    sleep_ms = before.elapsed_time(start)
    if enqueue_ms > 0.8 * sleep_ms:  # the queue may have drained: say so rather than report a host-paced time
        print(f"gpu_bound_ms: enqueue {enqueue_ms:.1f} ms vs sleep ~{sleep_ms:.1f} ms: not GPU-bound", flush=True)
    return gpu


def _host_breakdown(op, rank, M, calls=20) -> str:
    """Host microseconds per call spent in each step of the op (inclusive; wrappers around module
    functions, a few hundred ns each), and the host enqueue time, with Triton's launch path and with
    ``launcher``'s fast path."""
    from overlap_backend.codegen import cta, launcher
    from overlap_backend.runtime import cta_symm, cta_weights, symm
    from overlap_backend.runtime import cuda as _cuda

    spent: dict[str, float] = {}
    patched = []

    def wrap(owner, name, label):
        real = getattr(owner, name)

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return real(*a, **k)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - t

        patched.append((owner, name, real))
        setattr(owner, name, timed)

    for n in ("launch_stage0", "launch_stage1", "launch_tail", "launch_collect", "launch_begin"):
        wrap(cta, n, n)
    wrap(launcher, "launch", "triton launches (all)")
    wrap(launcher, "_variant_key", "  of which variant keys")
    wrap(cta_symm, "_push_blocks", "_push_blocks")
    wrap(cta_weights, "place", "cta_weights.place")
    for n in ("write_value32", "wait_value32", "memcpy_async"):
        wrap(_cuda, n, f"cuda.{n}")
    for n in ("begin", "end", "peer_tables", "ensure_data", "check_status"):
        wrap(symm.GroupState, n, f"GroupState.{n}")
    lines = []
    try:
        for fast in (False, True, False, True):
            knobs.codegen.set(FAST_LAUNCH=fast)
            spent.clear()
            host = []
            for i in range(calls):
                if i % 5 == 0:
                    torch.cuda.synchronize()
                t = time.perf_counter()
                op()
                host.append((time.perf_counter() - t) * 1e6)
            torch.cuda.synchronize()
            dist.barrier()
            parts = ", ".join(f"{k} {v / calls * 1e6:.0f}" for k, v in sorted(spent.items(), key=lambda kv: -kv[1]))
            lines.append(f"[host rank {rank} M={M} fast_launch={fast}] enqueue median {statistics.median(host):.0f} us "
                         f"(mean {statistics.mean(host):.0f}); per call, us: {parts}")
    finally:
        for owner, name, real in reversed(patched):
            setattr(owner, name, real)
        knobs.codegen.set(FAST_LAUNCH=True)
    return "\n".join(lines)


def _host_profile(op, rank, M, calls=20) -> str:
    """cProfile of ``calls`` eager calls (a sync every 5, so the GPU queue never pushes back)."""
    prof = cProfile.Profile()
    prof.enable()
    for i in range(calls):
        op()
        if i % 5 == 4:
            torch.cuda.synchronize()
    prof.disable()
    torch.cuda.synchronize()
    dist.barrier()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    return "\n".join(f"[profile rank {rank} M={M}] {line}" for line in text.getvalue().splitlines() if line.strip())


def _plan_str(plan) -> str:
    return f"(share {plan.f1}, ships {plan.fship}, tail {plan.tail}, kchunk {plan.kchunk} x {plan.nch})"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="512,4096", help="M values")
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--ffn", type=int, default=28672)
    p.add_argument("--stage1-variants", default="",
                   help="also time stage 1 alone in these block-config variants (as --stage0-variants)")
    p.add_argument("--stage0-variants", default="",
                   help="also time stage 0 alone (local stores) in these variants, comma-separated: "
                        "stages4 (4 pipeline stages), bn128, "
                        "group8 (GROUP_M 8), first (first row group counted at once), and combinations joined by '+'")
    p.add_argument("--profile", action="store_true", help="cProfile of 20 eager calls per M (host time)")
    p.add_argument("--gpu-bound", action="store_true",
                   help="also time the op (ce, peer, each --op-variants) and TP2 with 20 calls queued behind a GPU "
                        "sleep: GPU time per call without the host's pace")
    p.add_argument("--gpu-bound-trace", metavar="DIR",
                   help="with --gpu-bound: also a torch.profiler trace of 6 queued calls per M and rank "
                        "(DIR/cta_gpubound_M{M}_rank{r}.json; bench/tools/trace_summary.py lines the ranks up)")
    p.add_argument("--trace-variant", default="", help="with --gpu-bound-trace: the op variant traced (default: the op)")
    p.add_argument("--host-breakdown", action="store_true",
                   help="host time per call in each step, and the op's time, with and without launcher's fast path")
    p.add_argument("--op-variants", default="",
                   help="also time the whole op (ce) with these knobs.cta settings, comma-separated: "
                        "first / late (COUNT_FIRST_GROUP_AT_ONCE on / off), kN (K_CHUNKS=N), noshare (no GELU "
                        "stage-1 share), shareN (a GELU stage-1 share of N columns), notail (no stage-0 tails), "
                        "tailN (stage-0 tails of about N columns), nogrouptail (tails with one row group only), tma / notma (stage 0's "
                        "staged tiles by TMA or not), split / nosplit (STAGE0_SPLIT_LAST), shipfirst / noshipfirst (SHIP_BEFORE_TAILS), "
                        "smaxF / tmaxF (GELU_SHARE_MAX / TAIL_MAX = F: wider windows, a new placement), s0bn128 "
                        "(GELU's stage 0 in 128x128 tiles), and combinations joined by '+'")
    args = p.parse_args()
    rank, ws, device = common.init_distributed("cuda")
    assert ws == 2, "probe_cta runs on exactly 2 GPUs"
    from overlap_backend.codegen import cta
    from overlap_backend.runtime import cta_plan, cta_weights, symm
    from overlap_backend.spec import symm_layout
    from overlap_backend.runtime import cuda as _cuda
    from overlap_backend.spec import knobs

    H, Fd, dtype = args.hidden, args.ffn, torch.bfloat16
    g = dist.group.WORLD
    f = Fd // 2
    w1 = (torch.randn(H, f, device=device) * H**-0.5).to(dtype)
    w2 = (torch.randn(f, H, device=device) * Fd**-0.5).to(dtype)
    timing = common.Timing(device)
    out_lines = []
    for M in [int(v) for v in args.sizes.split(",")]:
        x = torch.randn(M, H, device=device).to(dtype)
        dist.broadcast(x, 0)

        def op():
            return torch.ops.overlap.cta_pipeline_mlp(x, w1, None, None, None, w2, None, "gelu", "tanh", 2,
                                                      g.group_name, "symm")

        full = {}
        timing.bench(op)  # discarded: the first timing of a size also paid for its placement and kernels
        for transport in ("ce", "peer"):
            with knobs.cta.patch(TRANSPORT=transport):
                full[transport], _ = timing.bench(op)
        for variant in filter(None, args.op_variants.split(",")):
            full[variant] = _op_variant(variant, timing, op)
        if args.gpu_bound:
            # Fewer calls at large M: each queues tp*G*nch copy-engine pushes (3 stream operations
            # each), and a full stream queue would make the host wait (M=4096: 32 blocks per call).
            queued = max(4, min(20, 20 * 1024 // M))
            bound = {"ce": gpu_bound_ms(op, queued)}
            with knobs.cta.patch(TRANSPORT="peer"):
                bound["peer"] = gpu_bound_ms(op, queued)
            for variant in filter(None, args.op_variants.split(",")):
                bound[variant] = _op_variant(variant, None, op, queued)

            def tp2():  # the same MLP in TP2: these ranks' shards, cuBLAS, an NCCL all-reduce
                y = torch.nn.functional.gelu(x @ w1, approximate="tanh") @ w2
                dist.all_reduce(y)
                return y

            if args.gpu_bound_trace:  # the calls' kernels back to back, as the GPUs ran them
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                        torch.profiler.ProfilerActivity.CUDA]) as prof:
                    if args.trace_variant:
                        _op_variant(args.trace_variant, None, op, 6)
                    else:
                        gpu_bound_ms(op, 6)
                Path(args.gpu_bound_trace).mkdir(parents=True, exist_ok=True)
                prof.export_chrome_trace(f"{args.gpu_bound_trace}/cta_gpubound_M{M}_rank{rank}.json")

            tp2()  # warm: the first all-reduce sets NCCL up (the sixth call's enqueue took 140 ms without this)
            bound["TP2 (cuBLAS + NCCL)"] = gpu_bound_ms(tp2, queued)
            print(f"[gpu-bound rank {rank} M={M}] ms per call: " + ", ".join(f"{k} {v:.3f}" for k, v in bound.items()),
                  flush=True)
        # Host time of one call (enqueue only), median of 20 after a sync.
        host = []
        for _ in range(20):
            torch.cuda.synchronize()
            dist.barrier()
            t = time.perf_counter()
            op()
            host.append((time.perf_counter() - t) * 1e3)
        torch.cuda.synchronize()
        dist.barrier()
        if args.profile:
            print(_host_profile(op, rank, M), flush=True)
        if args.host_breakdown:
            print(_host_breakdown(op, rank, M), flush=True)
            from overlap_backend.codegen import launcher
            for fast in (False, True, False, True):
                knobs.codegen.set(FAST_LAUNCH=fast)
                full[f"fast_launch={fast}"] = timing.bench(op)[0]
            knobs.codegen.set(FAST_LAUNCH=True)
        # The op without READY stream waits (unsafe; measurement only).
        real_wait = _cuda.wait_value32
        _cuda.wait_value32 = lambda *a: None
        try:
            no_ready, _ = timing.bench(op)
        finally:
            _cuda.wait_value32 = real_wait
        # Kernels alone, flags already raised (epoch 1 <= every flag after the calls above).
        st = symm.state(g.group_name, device)
        placed = next(p for k, p in cta_weights.placements.items() if k[1] == cta_plan.share_window(Fd, 1, False))
        cfg0, cfg1 = cta_plan.block_configs(dtype, False, M, H, st.num_sms)
        tiles_m = -(-M // cfg0[0])
        mp = tiles_m * cfg0[0]
        groups = -(-tiles_m // cfg0[3])
        kchunk, nch = cta_plan.k_chunks(Fd, cfg0[1], cfg1[2], groups, 1)
        data, flags = st.peer_tables()
        out = torch.empty(M, H, dtype=dtype, device=device)
        y_offset = -(-(nch * mp * kchunk * 2) // 256) * 256
        torch.cuda.synchronize()
        dist.barrier()
        alone = {}
        one = torch.ones(1, dtype=torch.int32, device=device)  # epoch 1: every flag is already past it
        B = symm_layout.cta_block(False)
        if rank == 0:
            counters = torch.zeros(2048, dtype=torch.int32, device=device)
            done = torch.zeros(2048, dtype=torch.int32, device=device)
            staging = torch.empty(nch * mp * kchunk, dtype=dtype, device=device)
            for name, buf in (("stage0 local stores", staging), ("stage0 peer stores", None)):
                alone[name] = common.events_ms(lambda buf=buf: cta.launch_stage0(
                    x, placed.w1, None, None, None, buf, data, flags, counters, done, one, 0, kchunk, nch,
                    B + symm_layout.CTA_ARRIVED, 1, 1, cta.ACT_GELU_TANH, cfg0, st.num_sms))
            for variant in filter(None, args.stage0_variants.split(",")):
                alone[f"stage0 {variant}"] = _stage0_variant(variant, st, placed, x, Fd, cfg0, cfg1, counters, done,
                                                             one)
            alone["cublas GEMM1"] = common.events_ms(lambda: torch.mm(x, placed.w1))
            y = st.data_view(dtype, (M, H), y_offset)
            alone["collect"] = common.events_ms(lambda: cta.launch_collect(y, out, st.flag_arg(B + symm_layout.CTA_Y_DONE), one,
                                                                    st.status_arg(), st.timeout_ns, 0, 1, -1,
                                                                    cfg0[0]))
        else:
            a = st.data_view(dtype, (nch * mp, kchunk))
            alone["stage1"] = common.events_ms(lambda: cta.launch_stage1(
                a, placed.w2, None, out, data, flags, y_offset, st.flag_arg(B + symm_layout.CTA_ARRIVED),
                torch.zeros(tiles_m, dtype=torch.int32, device=device), one, st.status_arg(), st.timeout_ns, 1, 2, M,
                Fd, 0, kchunk, nch, B + symm_layout.CTA_Y_DONE, 1, cfg1, st.num_sms))
            for variant in filter(None, args.stage1_variants.split(",")):
                alone[f"stage1 {variant}"] = _stage1_variant(variant, st, placed, M, Fd, cfg0, cfg1, out, y_offset, one)
            alone["cublas GEMM2"] = common.events_ms(lambda: torch.mm(out.new_empty(M, Fd), placed.w2))
        torch.cuda.synchronize()
        dist.barrier()
        # Stream-memop ping-pong latency between the two GPUs.
        stream = torch.cuda.current_stream()
        word_mine, word_peer = B + symm_layout.CTA_ARRIVED + 4090, B + symm_layout.CTA_ARRIVED + 4091
        base = 10**6 + M * 1000
        n = 200
        torch.cuda.synchronize()
        dist.barrier()
        s_ev, e_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s_ev.record()
        for i in range(1, n + 1):
            if rank == 0:
                _cuda.write_value32(st.flag_addr(word_peer, 1), base + i, stream)
                _cuda.wait_value32(st.flag_addr(word_mine), base + i, stream)
            else:
                _cuda.wait_value32(st.flag_addr(word_peer), base + i, stream)
                _cuda.write_value32(st.flag_addr(word_mine, 0), base + i, stream)
        e_ev.record()
        torch.cuda.synchronize()
        pingpong_us = s_ev.elapsed_time(e_ev) / n * 1e3
        line = (f"rank {rank} M={M}: op {({k: round(v, 3) for k, v in full.items()})} ms, op without READY waits {no_ready:.3f} ms, host enqueue "
                f"{statistics.median(host):.3f} ms, alone {({k: round(v, 3) for k, v in alone.items()})}, "
                f"groups {groups} kchunk {kchunk} nch {nch} cfg {cfg0}/{cfg1}, default plan "
                f"{_plan_str(cta_plan.chunk_plan(M, Fd, H, 1, False, dtype, st.num_sms, H=H))}, stream-memop round trip "
                f"{pingpong_us:.1f} us")
        print(line, flush=True)
        out_lines.append(line)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
