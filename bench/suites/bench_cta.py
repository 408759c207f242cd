"""CTA-pipelining benchmark: a tensor-parallel MLP's latency, one GPU vs TP vs micro-batching vs ours.

For each activation (GELU, SwiGLU) and M (tokens), at H=8192, F=28672 by default, bf16:

- ``1 GPU``: the whole MLP on rank 0 (cuBLAS), the others idle; ``1 GPU / 2`` is the ideal of two
  pipelined GPUs;
- ``TP2`` / ``TP<N>``: column/row-parallel shards, cuBLAS, NCCL all-reduce (TP2 on rank pairs, TP<N>
  on all N ranks: TP4 on 4 GPUs, TP8 on 8);
- ``µbatch``: two-stage pipeline at kernel granularity on a rank pair, built on the same peer-memory
  transport as ours (copy-engine pushes + stream waits on flags, ``runtime/symm/``): stage 0
  computes micro-batch i and pushes it while computing i+1; the best micro-batch count of
  ``--micro-batches`` is reported (and which);
- ``CTA 2`` (ours, ``symm``): ``overlap::cta_pipeline_mlp`` on a rank pair; ``CTA 2×TP<N/2>`` on all N
  ranks (2 stages of N/2 ranks: 2×TP2 on 4 GPUs, 2×TP4 on 8);
- from 8 GPUs on, ``CTA 4×TP<N/4>``: 4 stages are **not supported** by the symm kernels (they pipeline
  exactly 2 stages; the symm lowering would run the op on its p2p fallback): reported as such, never
  timed; instead ``p2p stages=4``: the op's portable ``p2p`` lowering with ``stages=4``, whose stages
  are 4 row micro-chunks, each reduced over all N ranks (a ring reduce-scatter fused with the MLP, then
  an all-gather overlapping the next chunk): TP<N> with overlapped communication, not a 4-GPU-stage pipeline;
- ``--graphs``: the baselines and every layout of ours captured in CUDA graphs and replayed (ours then
  counts epochs on the device; its tiles go by the default transport, the copy engine, with the
  default K-chunk count), with the bars' ratios on
  those times: ``CTA 2`` against one GPU / 2 and TP2, ``CTA 2×TP<N/2>`` against TP<N> (an eager call of
  ours at M <= 1024 is host-bound, so eager times say little about the bars there).

Timing: CUDA events after warm-up, median, maximum over ranks (bench/tools/common.py). Each of ours is
checked against the float32 MLP first (relative error). Writes ``cta_ws<N>.md`` / ``.json``
(rewritten after every row).

    torchrun --nproc-per-node=2 bench/suites/bench_cta.py --out-dir bench/results/<run>
    python bench/suites/bench_cta.py --list-layouts 8      # the variants a run with 8 GPUs takes (no GPU)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import overlap_backend  # noqa: E402,F401
from bench.tools import common  # noqa: E402


# Why the symm lowering does not take a layout of more than 2 stages (runtime/cta_symm.py: problem).
SYMM_STAGES_WHY = "the symm kernels pipeline exactly 2 GEMM stages (cta_symm: stages != 2 runs on the p2p fallback)"


@dataclass(frozen=True)
class Layout:
    """One variant of ``overlap::cta_pipeline_mlp`` that the benchmark runs (or reports)."""

    name: str  # column label, and key of the JSON row
    stages: int  # the op's ``stages`` argument
    tp: int  # ranks per stage (symm) / ranks the p2p ring reduces over
    group: str  # "pair" (every rank pair at once) or "world" (all ranks)
    lowering: str  # "symm" or "p2p"
    not_supported: str | None = None  # set: listed as not supported, never called
    sweep: bool = True  # time every transport x K-chunk count (symm's knobs.cta settings)


def tp_name(ws: int) -> str | None:
    """The all-rank tensor-parallel baseline: TP<ws> (None on 2 ranks: the pair's TP2 is that)."""
    return f"TP{ws}" if ws > 2 else None


def layouts(ws: int) -> list[Layout]:
    """The variants of ours at world size ``ws``: 2 stages on rank pairs; 2 stages x TP<ws/2> on all
    ranks; from 8 ranks on 4 stages x TP<ws/4> (not supported by symm: reported) and the p2p
    lowering's stages=4 (row micro-chunks over TP<ws>)."""
    out = [Layout("CTA 2", 2, 1, "pair", "symm")]
    if ws > 2 and ws % 2 == 0:
        out.append(Layout(f"CTA 2×TP{ws // 2}", 2, ws // 2, "world", "symm"))
    if ws >= 8 and ws % 4 == 0:
        out.append(Layout(f"CTA 4×TP{ws // 4}", 4, ws // 4, "world", "symm", not_supported=SYMM_STAGES_WHY))
        out.append(Layout("p2p stages=4", 4, ws, "world", "p2p", sweep=False))
    return out


def act_fn(act: str):
    if act == "gelu":
        return lambda h, g: F.gelu(h, approximate="tanh")
    return lambda h, g: F.silu(h) * g


class MLP:
    """One rank's weights: the full MLP (``full``) and its TP shards of a group of ``tp`` ranks."""

    def __init__(self, act, H, Fd, dtype, device, tp, tp_rank, full: bool):
        gen = torch.Generator(device=device).manual_seed(0)

        def w(*shape, scale):  # the same full weights on every rank (same generator, same seed)
            return (torch.randn(*shape, generator=gen, device=device) * scale).to(dtype)

        W1 = w(H, Fd, scale=H**-0.5)
        W3 = w(H, Fd, scale=H**-0.5) if act == "swiglu" else None
        W2 = w(Fd, H, scale=Fd**-0.5)
        f = Fd // tp
        cols = slice(tp_rank * f, (tp_rank + 1) * f)
        self.w1, self.w2 = W1[:, cols].contiguous(), W2[cols].contiguous()
        self.w3 = W3[:, cols].contiguous() if W3 is not None else None
        self.full = (W1, W3, W2) if full else None
        del W1, W2, W3


def mlp(x, w1, w3, w2, act):
    h = x @ w1
    return act_fn(act)(h, x @ w3 if w3 is not None else None) @ w2


class MicroBatch:
    """Stage 0 on the pair's rank 0, stage 1 on its rank 1; ``k`` micro-batches pushed by the copy
    engine (flags ``CTA_ARRIVED + i`` / ``CTA_Y_DONE + i`` of the op's eager flag block)."""

    def __init__(self, st, weights, act, M, H, Fd, dtype, device):
        from overlap_backend.spec import symm_layout

        self.st, self.act, self.M = st, act, M
        self.W1, self.W3, self.W2 = weights
        es = torch.empty((), dtype=dtype).element_size()
        self.h_bytes = -(-(M * Fd * es) // 256) * 256
        st.ensure_data(self.h_bytes + M * H * es)
        self.hbuf = st.data_view(dtype, (M, Fd))
        self.ybuf = st.data_view(dtype, (M, H), self.h_bytes)
        self.h = torch.empty(M, Fd, dtype=dtype, device=device)
        self.out = torch.empty(M, H, dtype=dtype, device=device)
        self.row_h, self.row_y = Fd * es, H * es
        self.arrived = symm_layout.cta_block(False) + symm_layout.CTA_ARRIVED  # words of the op's eager block (same epochs)
        self.y_done = symm_layout.cta_block(False) + symm_layout.CTA_Y_DONE

    def __call__(self, x, k):
        from overlap_backend.runtime import cuda as _cuda

        st = self.st
        compute = torch.cuda.current_stream()
        epoch = st.begin(compute)
        bounds = [(i * self.M // k, (i + 1) * self.M // k) for i in range(k)]
        if st.rank == 0:
            for i, (lo, hi) in enumerate(bounds):
                xs = x[lo:hi]
                h = xs @ self.W1
                self.h[lo:hi] = act_fn(self.act)(h, xs @ self.W3 if self.W3 is not None else None)
                st.push_stream.wait_stream(compute)
                st.push(1, lo * self.row_h, self.h[lo].data_ptr(), (hi - lo) * self.row_h, self.arrived + i)
            for i, (lo, hi) in enumerate(bounds):
                _cuda.wait_value32(st.flag_addr(self.y_done + i), epoch, compute)
            self.out.copy_(self.ybuf)
        else:
            for i, (lo, hi) in enumerate(bounds):
                _cuda.wait_value32(st.flag_addr(self.arrived + i), epoch, compute)
                torch.mm(self.hbuf[lo:hi], self.W2, out=self.out[lo:hi])
                st.push_stream.wait_stream(compute)
                st.push(0, self.h_bytes + lo * self.row_y, self.out[lo].data_ptr(), (hi - lo) * self.row_y,
                        self.y_done + i)
        st.end(compute)
        return self.out


def run(args) -> int:
    rank, ws, device = common.init_distributed("cuda")
    if ws % 2:  # rank pairs and two equal stages
        if rank == 0:
            print(f"bench_cta: needs an even number of GPUs, got {ws}", file=sys.stderr)
        dist.destroy_process_group()
        return 2
    dtype = torch.bfloat16
    timing = common.Timing(device, warmup_ms=10 if args.quick else 25, rep_ms=30 if args.quick else 100)
    from overlap_backend.spec import knobs
    from overlap_backend.runtime import symm
    from overlap_backend.runtime.symm import lowering_helpers

    knobs.codegen.set(AUTOTUNE=False)
    world = dist.group.WORLD
    pairs = [dist.new_group([2 * p, 2 * p + 1]) for p in range(ws // 2)]
    pair = pairs[rank // 2]
    pair_rank = rank % 2
    H, Fd = args.hidden, args.ffn
    info = common.machine_info(device, ws)
    info.update(dtype=str(dtype), hidden=H, ffn=Fd)
    rows, ok = [], True
    ours = layouts(ws)
    world_tp = tp_name(ws)
    info["layouts"] = [vars(lay) for lay in ours]
    out_dir = Path(args.out_dir)

    def write():
        if rank == 0:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / f"cta_ws{ws}.md").write_text(render(rows, ws, info, args))
            common.write_json(out_dir / f"cta_ws{ws}.json", {"info": info, "rows": rows})

    for act in args.acts:
        full = MLP(act, H, Fd, dtype, device, 2, pair_rank, full=(rank == 0))
        tp_all = MLP(act, H, Fd, dtype, device, ws, rank, full=False) if world_tp else None
        for M in args.m:
            torch.manual_seed(M)
            x = torch.randn(M, H, device=device).to(dtype)
            dist.broadcast(x, 0)
            row = {"act": act, "M": M}

            def single():
                if rank == 0:
                    return mlp(x, *full.full, act)

            def tp(group, shards):
                def fn():
                    y = mlp(x, shards.w1, shards.w3, shards.w2, act)
                    dist.all_reduce(y, group=group)
                    return y
                return fn

            def cta(group, shards, stages=2, lowering="symm"):
                return lambda: torch.ops.overlap.cta_pipeline_mlp(
                    x, shards.w1, None, shards.w3, None, shards.w2, None, act,
                    "tanh" if act == "gelu" else "none", stages, group.group_name, lowering)

            variants = {"1 GPU": single, "TP2": tp(pair, full)}
            if world_tp:
                variants[world_tp] = tp(world, tp_all)
            for name, fn in variants.items():
                row[name], _ = timing.bench(fn)
                if args.graphs:
                    row[f"{name} (graph)"] = _bench_graph(timing, fn)
            # Ours: check first (against the float32 TP result of the same group), then time.
            refs = {"pair": tp(pair, full)().float()}
            if world_tp:
                refs["world"] = tp(world, tp_all)().float()
            ref = refs["pair"]
            for lay in ours:
                if lay.not_supported:  # the same on every rank: nothing is called
                    row[lay.name], row[f"{lay.name} status"] = None, f"not supported: {lay.not_supported}"
                    continue
                group, shards = (pair, full) if lay.group == "pair" else (world, tp_all)
                fn = cta(group, shards, lay.stages, lay.lowering)
                before = lowering_helpers.PATHS["cta_pipeline_mlp:symm"]
                out = fn()
                err = common.rel_err(out.float(), refs[lay.group])
                row[f"{lay.name} err"] = err
                if lay.lowering == "symm":
                    ran = lowering_helpers.PATHS["cta_pipeline_mlp:symm"] > before
                    row[f"{lay.name} path"] = "symm" if ran else "p2p"
                else:
                    row[f"{lay.name} path"] = "p2p"
                ok &= err <= 2e-2
                if lay.sweep:
                    settings = ([("", {})] if lay.lowering != "symm" else
                                args.swiglu_settings if act == "swiglu" else args.gelu_settings)
                    row[lay.name], row[f"{lay.name} kc"] = _sweep_k_chunks(
                        timing, fn, args.k_chunks, row, lay.name, args.transports, settings,
                        check=lambda out, ref=refs[lay.group]: common.rel_err(out.float(), ref))
                    ok &= all(v <= 2e-2 for k, v in row.items() if k.startswith(f"{lay.name} err "))
                else:
                    row[lay.name], _ = timing.bench(fn)
                    row[f"{lay.name} kc"] = "—"
                if args.graphs:  # captured: device epochs, the default transport and K-chunks
                    row[f"{lay.name} (graph)"] = _bench_graph(timing, fn)
            # Micro-batching over the same transport (rank pairs; stage weights: full W1/W3 on the
            # pair's rank 0, full W2 on its rank 1 — gathered here, outside the timing).
            st = symm.state(pair.group_name, device)
            gathered = _stage_weights(full, pair, pair_rank)
            mb = MicroBatch(st, gathered, act, M, H, Fd, dtype, device)
            best = None
            for k in args.micro_batches:
                if k > M:
                    continue
                err = common.rel_err(mb(x, k).float(), ref)
                if not err <= 2e-2:
                    ok = False
                    row[f"µbatch k={k} err"] = err
                t, _ = timing.bench(lambda k=k: mb(x, k))
                row[f"µbatch k={k}"] = t
                if best is None or t < best[0]:
                    best = (t, k)
            row["µbatch"], row["µbatch k"] = best if best else (float("nan"), 0)
            del gathered, mb
            rows.append(row)
            write()
            if rank == 0:
                print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
            if args.trace and M in args.trace_m and rank < 2:
                _trace(Path(args.trace), f"cta_ws{ws}_{act}_M{M}_rank{rank}", cta(pair, full))
        del full, tp_all
        torch.cuda.empty_cache()
    if rank == 0:
        write()
        print(render(rows, ws, info, args), flush=True)
    common.synchronize(device)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


def _sweep_k_chunks(timing, fn, values, row, name, transports=("ce", "peer"), settings=(("", {}),), check=None):
    """Time ``fn`` for each transport (knobs.cta.TRANSPORT), K-chunk count (knobs.cta.K_CHUNKS, the
    stage-1 wait granularity) and settings variant (``(label, {knobs.cta name: value})``, e.g. SwiGLU's
    share sizing; a variant other than the defaults is checked first: ``check(out)`` -> relative error,
    kept as "<name> err <label>"); keep every time in ``row``; return (best time,
    "transport/count[+label]")."""
    from overlap_backend.spec import knobs

    best = None
    for label, values_ in settings:
        with knobs.cta.patch(**values_):
            if label and check is not None:
                row[f"{name} err {label}"] = check(fn())
            for transport in transports:
                for kc in values:
                    with knobs.cta.patch(TRANSPORT=transport, K_CHUNKS=kc):
                        t, _ = timing.bench(fn)
                    row[f"{name} {transport} kc={kc}" + (f" {label}" if label else "")] = t
                    if best is None or t < best[0]:
                        best = (t, f"{transport}/{kc}" + (f"+{label}" if label else ""))
    return best


def _stage_weights(shards: MLP, pair, pair_rank):
    """Full W1 (and W3) on the pair's rank 0, full W2 on its rank 1, from the TP2 shards."""
    def gather(t, dim):
        parts = [torch.empty_like(t) for _ in range(2)]
        dist.all_gather(parts, t.contiguous(), group=pair)
        return torch.cat(parts, dim)

    W1 = gather(shards.w1, 1)
    W3 = gather(shards.w3, 1) if shards.w3 is not None else None
    W2 = gather(shards.w2, 0)
    return (W1, W3, None) if pair_rank == 0 else (None, None, W2)


def _bench_graph(timing, fn):
    """The same call captured once in a CUDA graph and replayed."""
    try:
        g = common.capture_graph(fn)
        t, _ = timing.bench(g.replay)
        return t
    except Exception as e:  # noqa: BLE001 - a baseline that cannot be captured shows as n/a
        print(f"bench_cta: graph capture failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
        return float("nan")


def _trace(trace_dir: Path, stem: str, fn):
    trace_dir.mkdir(parents=True, exist_ok=True)
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace_dir / f"{stem}.json"))


def render(rows, ws, info, args) -> str:
    def r(a, b):
        return f"{a / b:.2f}" if a and b and a == a and b == b else "n/a"

    world_tp = tp_name(ws)
    ours = layouts(ws)
    pair_cta, world_ctas = ours[0], [lay for lay in ours[1:]]
    world_symm = next((lay for lay in world_ctas if lay.lowering == "symm" and not lay.not_supported), None)
    cols = ["act", "M", "1 GPU", "1 GPU / 2", "TP2"] + ([world_tp] if world_tp else []) + ["µbatch (k)", pair_cta.name]
    cols += [lay.name for lay in world_ctas] + ["CTA 2 / (1 GPU / 2)", "TP2 / CTA 2", "µbatch / CTA 2"]
    cols += [f"{world_tp} / {world_symm.name}"] if world_symm else []
    cols += ["err"]
    graphed = [lay for lay in ours if not lay.not_supported]
    if args.graphs:
        cols += ["1 GPU graph", "TP2 graph"] + ([f"{world_tp} graph"] if world_tp else [])
        cols += [f"{lay.name} graph" for lay in graphed]
        cols += ["graph: CTA 2 / (1 GPU / 2)", "graph: TP2 / CTA 2"]
        cols += [f"graph: {world_tp} / {world_symm.name}"] if world_symm else []
    table = []
    for row in rows:
        half = row["1 GPU"] / 2
        line = [row["act"], row["M"], common.fmt_ms(row["1 GPU"]), common.fmt_ms(half), common.fmt_ms(row["TP2"])]
        line += [common.fmt_ms(row[world_tp])] if world_tp else []
        line += [f"{common.fmt_ms(row['µbatch'])} ({row['µbatch k']})", f"{common.fmt_ms(row['CTA 2'])} ({row['CTA 2 kc']})"]
        for lay in world_ctas:
            line += ["not supported" if lay.not_supported else
                     f"{common.fmt_ms(row[lay.name])}" + (f" ({row[lay.name + ' kc']})" if lay.sweep else "")]
        line += [r(row["CTA 2"], half), r(row["TP2"], row["CTA 2"]), r(row["µbatch"], row["CTA 2"])]
        line += [r(row[world_tp], row[world_symm.name])] if world_symm else []
        errs = [f"{row[lay.name + ' err']:.1e}" + ("" if row.get(lay.name + " path") != "p2p" or lay.lowering == "p2p"
                                                     else " (p2p!)")
                for lay in ours if not lay.not_supported]
        line += ["/".join(errs)]
        if args.graphs:
            line += [common.fmt_ms(row.get("1 GPU (graph)")), common.fmt_ms(row.get("TP2 (graph)"))]
            line += [common.fmt_ms(row.get(f"{world_tp} (graph)"))] if world_tp else []
            line += [common.fmt_ms(row.get(f"{lay.name} (graph)")) for lay in graphed]
            one = row.get("1 GPU (graph)")
            line += [r(row.get("CTA 2 (graph)"), one / 2 if one else None),
                     r(row.get("TP2 (graph)"), row.get("CTA 2 (graph)"))]
            line += [r(row.get(f"{world_tp} (graph)"), row.get(f"{world_symm.name} (graph)"))] if world_symm else []
        table.append(line)
    notes = [f"- `{lay.name}`: not supported: {lay.not_supported}." for lay in ours if lay.not_supported]
    notes += ["- `p2p stages=4`: the p2p lowering's `stages` are row micro-chunks, each reduced over all "
              f"{ws} ranks (ring reduce-scatter fused with the MLP, all-gather overlapping the next chunk): "
              f"{world_tp} with overlapped communication, not a pipeline of 4 GPU stages."
              for lay in ours if lay.lowering == "p2p"]
    return (f"# CTA-pipelining: MLP latency, H={args.hidden}, F={args.ffn}, bf16, ws={ws} (ms)\n\n"
            + common.info_markdown(info) + "\n\n" + common.markdown_table(cols, table) + "\n\n"
            "Ratios > 1 mean ours is faster, except `CTA 2 / (1 GPU / 2)` (the bar: <= 1.10). In parentheses: "
            "the best micro-batch count (µbatch), the best transport / K-chunk count per stage-0 rank (ours). err: "
            "ours vs the TP result in float32 (relative), one per variant of ours in column order; (p2p!): the symm "
            "lowering ran it on its p2p fallback. Graph columns: CUDA-graph replays (each of ours with its default "
            "transport and K-chunk count), and the same ratios on them.\n"
            + ("\n" + "\n".join(notes) + "\n" if notes else ""))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="16,128,512,1024,4096", help="token counts M (comma-separated)")
    p.add_argument("--acts", default="gelu,swiglu", help="gelu (tanh), swiglu")
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--ffn", type=int, default=28672)
    p.add_argument("--micro-batches", default="2,4,8")
    p.add_argument("--k-chunks", default="4,8,16", help="K-chunks per stage-0 rank to sweep (ours)")
    p.add_argument("--transports", default="ce,peer", help="stage-0 transports to sweep (ours): ce, peer")
    p.add_argument("--swiglu-shares", default="rounds",
                   help="SwiGLU stage-1 shares to sweep (ours, symm; knobs.cta.SWIGLU_SHARE_ROUNDS): rounds (balanced "
                        "in whole rounds of SMs, the default), work (balanced work), or rounds,work")
    p.add_argument("--graphs", action="store_true", help="also time the baselines captured in CUDA graphs")
    p.add_argument("--trace", metavar="DIR", help="torch.profiler traces of ours on ranks 0 and 1")
    p.add_argument("--trace-m", default="4096", help="with --trace: the M values to trace")
    p.add_argument("--out-dir", default="bench/results")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--list-layouts", metavar="WS", type=int, default=None,
                   help="print the variants a run with WS GPUs takes (baselines, ours, what is not supported), then exit")
    common.add_set_argument(p)  # e.g. --set cta.STAGE0_GEMM=cublas (an A/B of the stages' GEMM forms)
    args = common.parse_args_with_sets(p, argv)
    args.m = [int(v) for v in args.sizes.split(",")]
    args.acts = [a for a in args.acts.split(",") if a]
    if any(a not in ("gelu", "swiglu") for a in args.acts):
        p.error("--acts: gelu, swiglu")
    args.micro_batches = [int(v) for v in args.micro_batches.split(",")]
    args.k_chunks = [int(v) for v in args.k_chunks.split(",")]
    args.transports = [t for t in args.transports.split(",") if t]
    shares = [v for v in args.swiglu_shares.split(",") if v]
    if not shares or any(v not in ("rounds", "work") for v in shares):
        p.error("--swiglu-shares: rounds, work, or rounds,work")
    # (label, knobs.cta settings) per swept variant of ours on symm: what differs from the defaults
    # (none: ""); SwiGLU's shares only apply to SwiGLU
    args.swiglu_settings = [("work" if share == "work" else "", {"SWIGLU_SHARE_ROUNDS": share == "rounds"})
                            for share in dict.fromkeys(shares)]
    args.gelu_settings = [("", {})]
    args.trace_m = {int(v) for v in args.trace_m.split(",")}
    return args


def print_layouts(ws: int) -> None:
    print(f"world size {ws}: baselines 1 GPU, TP2 (rank pairs)" + (f", {tp_name(ws)} (all ranks)" if tp_name(ws) else ""))
    for lay in layouts(ws):
        where = "every rank pair" if lay.group == "pair" else f"all {ws} ranks"
        print(f"  {lay.name}: stages={lay.stages}, {lay.lowering}, {where}"
              + (f": NOT SUPPORTED ({lay.not_supported})" if lay.not_supported else ""))


if __name__ == "__main__":
    a = parse_args()
    if a.list_layouts is not None:
        print_layouts(a.list_layouts)
        sys.exit(0)
    if not torch.cuda.is_available():
        print("bench_cta: CUDA is not available (use the device machine)", file=sys.stderr)
        sys.exit(2)
    code = run(a)
    sys.stdout.flush()
    sys.exit(code)
