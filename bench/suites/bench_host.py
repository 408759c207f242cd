"""Host time per call of a compiled collective-GEMM graph: ``backend="overlap"`` against the same graph
compiled by Inductor with NCCL.

    torchrun --nproc-per-node=N bench/suites/bench_host.py --out DIR [--sizes 128,512,2048,8192]
        [--ops ag_mm,mm_rs,mm_ar[,moe,cta]] [--lowering symm] [--profile] [--set symm.KNOB=v]

For each graph (bf16, ``M`` tokens per rank) and each M:

- ``ag_mm``: all-gather -> mm of the gathered [M, K]; ``mm_rs``: mm of [M, K] -> reduce-scatter; ``mm_ar``: mm of
  [M, K] -> all-reduce (K = N = 4096);
- ``moe`` (``overlap::moe_experts``): a capacity-routed expert-parallel MoE block as ``models/moe.py`` writes it
  (``MoELayer._capacity`` with the bmm expert form), from the dispatch buffer on: each rank's ``M`` tokens routed
  to ``MOE_TOP_K`` = 2 of ``MOE_EXPERTS`` = 8 experts with capacity factor 1, so every (expert, source rank) pair
  holds ``2M / 8`` rows and the all-to-all splits are fixed and equal (static shapes); dispatch
  ``all_to_all_single`` of the [2M, H] buffer -> SwiGLU experts by ``bmm`` over [8 / ws experts, ws·2M / 8 rows, H]
  (H = 4096, F = ``MOE_F`` = 1024: Mixtral's H with a small F, to keep memory and GPU time small; host time does
  not depend on F) -> combine ``all_to_all_single``. Every rank sends and computes the same rows whatever the
  group's size, so the one-rank baseline groups below compute what a rank of the overlap group does;
- ``cta`` (``overlap::cta_pipeline_mlp``, the ``cta_pipeline`` pass, off by default, is listed for this graph
  only): the tensor-parallel GELU MLP, ``all_reduce(F.linear(gelu_tanh(F.linear(x, W1)), W2))`` with x [M, H]
  (the replicated input of a TP MLP; each rank draws its own values here, which the host path does not read) and
  this rank's shards W1 [F/ws, H], W2 [H, F/ws] (H = 4096, F = ``MLP_F`` = 4H, no biases);
  the group's size must be even (2 stages of ws/2 ranks);

the host µs per call (``common.host_us``: wall time of ``--calls`` calls that are not waited for, median of 5
rounds, max over ranks) of

- ``overlap``: the graph compiled with ``backend="overlap"`` (cost model off, the ``--lowering``) on the
  benchmark's group;
- ``inductor``: the same graph compiled by Inductor on an NCCL group: the benchmark's group when every
  rank has a GPU of its own, else (ranks sharing one GPU) a one-rank NCCL group per rank;
- ``torch.mm``: the local GEMM alone (eager), for scale (``moe``: the rank's expert GEMMs, ``cta``: its shard of
  the MLP, both in eager torch);

their ratio and difference (the overlap op's own host time), the GPU ms per call of each (CUDA events,
median of 20), the same host time with only 5 calls per burst and of one call started on an idle GPU: where
a burst's calls queue more GPU work than the GPU retires, a longer burst measures the GPU, not the host. Ranks sharing one GPU run
the overlap graph over a gloo group with ``symm`` allowed on it (its data path never uses the group's
collectives). ``--profile``: a cProfile of 40 steady-state calls of each overlap graph on rank 0.

The ``moe`` and ``cta`` rows are checked before they are timed: their pass rewrote the graph (the backend's
reports), and under ``--lowering symm`` the op ran on symm (``lowering_helpers.PATHS``), not on its p2p
fallback; the benchmark stops with the reason otherwise.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.tools import common  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import overlap_backend  # noqa: E402
from overlap_backend.config import PASS_NAMES  # noqa: E402
from overlap_backend.models.moe import bmm_swiglu  # noqa: E402
from overlap_backend.spec import knobs  # noqa: E402

K = N = 4096
H = 4096  # hidden size of the moe and cta graphs
MOE_F, MOE_EXPERTS, MOE_TOP_K = 1024, 8, 2
MLP_F = 4 * H
OPS = ("ag_mm", "mm_rs", "mm_ar", "moe", "cta")
# the overlap op each graph's pass makes, and the pass (checked for the graphs listed)
CHECKED = {"moe": ("moe_experts", "moe"), "cta": ("cta_pipeline_mlp", "cta_pipeline")}


@dataclass(frozen=True)
class Graph:
    """One benchmarked graph: ``fn(x, *weights)`` on a group, and how to make its inputs."""

    fn: Callable
    rows: Callable[[int], int]  # rows of this rank's x for M tokens
    cols: int  # columns of x
    weights: Callable  # weights(device, dtype) -> tuple, the same for the overlap and the Inductor graph
    local: Callable  # local(x, *weights): this rank's GEMMs alone, eager (the "torch.mm" column)


def _randn(device, dtype, *shape, fan_in):
    return torch.randn(*shape, device=device, dtype=dtype) / fan_in**0.5


def graphs(group, world: int | None = None, *, k: int = K, n: int = N, hidden: int = H, moe_ffn: int = MOE_F,
           experts: int = MOE_EXPERTS, top_k: int = MOE_TOP_K, mlp_ffn: int = MLP_F) -> dict[str, Graph]:
    """{op: Graph} on ``group``. ``world``: the overlap group's size (default ``group``'s), which fixes the
    moe graph's local experts and the cta graph's shards, so that a one-rank baseline group computes what a
    rank of the overlap group does."""
    ws = group.size()
    world = world or ws
    local_experts = experts // world

    def ag(x, w):
        return torch.mm(funcol.all_gather_tensor(x, 0, group), w)

    def rs(x, w):
        return funcol.reduce_scatter_tensor(torch.mm(x, w), "sum", 0, group)

    def ar(x, w):
        return funcol.all_reduce(torch.mm(x, w), "sum", group)

    def moe(x, w_gate, w_up, w_down):
        # models/moe.py MoELayer._capacity from the dispatch buffer [E * cap, H] (expert-major) on
        el, h = w_gate.shape[0], x.shape[1]
        recv = funcol.all_to_all_single(x, None, None, group)  # [ws (source), E_local, cap, H]
        xe = recv.view(ws, el, -1, h).transpose(0, 1).reshape(el, -1, h)
        ye = bmm_swiglu(xe, w_gate, w_up, w_down)  # [E_local, ws * cap, H]
        back = ye.view(el, ws, -1, h).transpose(0, 1).reshape(-1, h)
        return funcol.all_to_all_single(back, None, None, group)  # [E * cap, H]: this rank's tokens

    def mlp(x, w1, w2):
        return funcol.all_reduce(F.linear(F.gelu(F.linear(x, w1), approximate="tanh"), w2), "sum", group)

    def moe_rows(m):
        rows = m * top_k
        if rows % experts:
            raise ValueError(f"moe: M={m} tokens x top-{top_k} do not split evenly over {experts} experts")
        return rows

    def mm_weights(device, dtype):
        return (_randn(device, dtype, k, n, fan_in=k),)

    def moe_weights(device, dtype):
        return (_randn(device, dtype, local_experts, hidden, moe_ffn, fan_in=hidden),
                _randn(device, dtype, local_experts, hidden, moe_ffn, fan_in=hidden),
                _randn(device, dtype, local_experts, moe_ffn, hidden, fan_in=moe_ffn))

    def mlp_weights(device, dtype):
        f = mlp_ffn // world
        return _randn(device, dtype, f, hidden, fan_in=hidden), _randn(device, dtype, hidden, f, fan_in=mlp_ffn)

    def local_mm(x, w):
        return torch.mm(x, w)

    def local_moe(x, w_gate, w_up, w_down):
        return bmm_swiglu(x.view(w_gate.shape[0], -1, x.shape[1]), w_gate, w_up, w_down)

    def local_mlp(x, w1, w2):
        return F.linear(F.gelu(F.linear(x, w1), approximate="tanh"), w2)

    return {
        "ag_mm": Graph(ag, lambda m: m // ws, k, mm_weights, local_mm),
        "mm_rs": Graph(rs, lambda m: m, k, mm_weights, local_mm),
        "mm_ar": Graph(ar, lambda m: m, k, mm_weights, local_mm),
        "moe": Graph(moe, moe_rows, hidden, moe_weights, local_moe),
        "cta": Graph(mlp, lambda m: m, hidden, mlp_weights, local_mlp),
    }


def make_backend(op: str, lowering: str):
    """The overlap backend for ``op``'s graph: cost model off; every pass for ``cta`` (its pass is off by
    default), the default passes otherwise."""
    extra = {"passes": PASS_NAMES} if op == "cta" else {}
    return overlap_backend.make_backend(cost_model="off", lowering=lowering, **extra)


def check_applied(op: str, reports, took: dict, lowering: str) -> None:
    """For the ops of ``CHECKED``: ``op``'s pass rewrote the graph (``reports``: the backend's reports of its
    compile), and under symm the op ran on symm (``took``: the PATHS counted by its calls)."""
    if op not in CHECKED:
        return
    name, pass_name = CHECKED[op]
    matches = [m for r in reports for m in r.matches if m.pass_name == pass_name]
    if not any(m.applied for m in matches):
        raise RuntimeError(f"{op}: the {pass_name} pass did not rewrite the graph: "
                           f"{[(m.applied, m.reason) for m in matches] or 'no match'}")
    if lowering == "symm" and (not took.get(f"{name}:symm") or took.get(f"{name}:p2p")):
        raise RuntimeError(f"{op}: overlap::{name} did not run on symm in its warm-up calls (paths {took}; the "
                           "reason is logged by overlap_backend.symm)")


def setup():
    """(rank, ws, device, overlap group, inductor group, shared)"""
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    shared = torch.cuda.device_count() < ws
    local = 0 if shared else int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    if shared:
        dist.init_process_group("gloo", timeout=timedelta(seconds=300))
        knobs.symm.set(GROUP_BACKENDS=("nccl", "gloo"))
        solo = None
        for r in range(ws):  # new_group is collective over the default group: every rank makes every one
            g = dist.new_group([r], backend="nccl")
            solo = g if r == rank else solo
        return rank, ws, device, dist.group.WORLD, solo, True
    dist.init_process_group("nccl", device_id=device, timeout=timedelta(seconds=300))
    return rank, ws, device, dist.group.WORLD, dist.group.WORLD, False


def single_us(fn, device, n: int = 20) -> float:
    """Host µs of one call started on an idle GPU (a synchronize and a barrier before each): what the call's
    host path costs without a queue of earlier calls in front of it; median of ``n``, max over ranks."""
    import statistics
    import time

    times = []
    for _ in range(n):
        common.synchronize(device)
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    common.synchronize(device)
    return common.allreduce_max([statistics.median(times)], device)[0]


def profile_text(fn, calls: int = 40) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    buf.write(f"{calls} calls\n")
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(30)
    return buf.getvalue()


def driver_costs(device, n: int = 2000) -> dict:
    """Host µs per call of the driver and torch.cuda operations an op call is made of (this rank alone)."""
    import time

    from overlap_backend.runtime import cuda as _cuda

    word = torch.zeros(64, dtype=torch.int32, device=device)
    addr = word.data_ptr()
    src = torch.zeros(1024, dtype=torch.uint8, device=device)
    dst = torch.zeros(1024, dtype=torch.uint8, device=device)
    s1, s2 = torch.cuda.Stream(device), torch.cuda.Stream(device)
    ev = _cuda.event_create()
    h1, h2 = s1.cuda_stream, s2.cuda_stream
    cases = {
        "write_value32 (ctypes)": lambda: _cuda.write_value32(addr, 1, s1),
        "wait_value32 (ctypes, satisfied)": lambda: _cuda.wait_value32(addr, 0, s1),
        "memcpy_async 1 KiB (ctypes)": lambda: _cuda.memcpy_async(dst.data_ptr(), src.data_ptr(), 1024, s1),
        "torch.cuda.current_stream()": lambda: torch.cuda.current_stream(device),
        "Stream.wait_stream (torch)": lambda: s2.wait_stream(s1),
        "cuEventRecord + cuStreamWaitEvent (ctypes, runtime/cuda.py: join)": lambda: _cuda.join(h2, h1, ev),
        "torch.empty 512x4096 bf16": lambda: torch.empty((512, 4096), dtype=torch.bfloat16, device=device),
        "is_current_stream_capturing": torch.cuda.is_current_stream_capturing,
    }
    out = {}
    for name, fn in cases.items():
        for _ in range(50):
            fn()
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out[name] = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize(device)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sizes", default="128,512,2048,8192")
    p.add_argument("--ops", default="ag_mm,mm_rs,mm_ar")
    p.add_argument("--lowering", default="symm")
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--private-graphs", action="store_true",
                   help="also the overlap graph with its ops replaying private CUDA graphs (knobs.symm.PRIVATE_GRAPHS, the default); "
                        "the overlap column is always the ops' eager host path")
    p.add_argument("--layers", type=int, default=0,
                   help="also each op called in turn with LAYERS weights (the same key at LAYERS addresses, as in a "
                        "model of that many layers): host µs per call with private graphs and without")
    common.add_set_argument(p)
    args = common.parse_args_with_sets(p, argv)
    rank, ws, device, group, nccl_group, shared = setup()
    from overlap_backend.runtime.symm import lowering_helpers, private_graphs

    sizes = [int(s) for s in args.sizes.split(",")]
    ops = args.ops.split(",")
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise SystemExit(f"--ops: unknown {unknown}; allowed: {', '.join(OPS)}")
    if "cta" in ops and ws % 2:
        raise SystemExit(f"--ops cta needs an even number of ranks (2 stages of ws/2), not {ws}")
    if "moe" in ops and MOE_EXPERTS % ws:
        raise SystemExit(f"--ops moe needs a number of ranks that divides its {MOE_EXPERTS} experts, not {ws}")
    over, ind = graphs(group, ws), graphs(nccl_group, ws)
    torch.manual_seed(rank)
    rows, profiles = [], {}
    for op in ops:
        g_o, g_i = over[op], ind[op]
        backend = make_backend(op, args.lowering)
        comp_o = torch.compile(g_o.fn, backend=backend, dynamic=False)
        comp_i = torch.compile(g_i.fn, dynamic=False)
        for m in sizes:
            torch._dynamo.reset()  # one graph per size: a recompile per size, not a dynamic graph
            x = torch.randn(g_o.rows(m), g_o.cols, device=device, dtype=torch.bfloat16)
            xi = torch.randn(g_i.rows(m), g_i.cols, device=device, dtype=torch.bfloat16)
            w = g_o.weights(device, torch.bfloat16)
            before, reports = dict(lowering_helpers.PATHS), len(backend.reports)
            cases = {"overlap": lambda: comp_o(x, *w), "inductor": lambda: comp_i(xi, *w),
                     "torch.mm": lambda: g_i.local(xi, *w)}
            with knobs.symm.patch(PRIVATE_GRAPHS=False):  # the overlap column: the ops' eager host path
                for _ in range(3):
                    comp_o(x, *w)
                    comp_i(xi, *w)
                common.synchronize(device)
                took = {k: v - before.get(k, 0) for k, v in lowering_helpers.PATHS.items() if v != before.get(k, 0)}
                check_applied(op, backend.reports[reports:], took, args.lowering)
                res = {"op": op, "M": m, "paths": took}
                for name, fn in cases.items():
                    measure(res, name, fn, device, args.calls)
            res["ratio"] = res["overlap_host_us"] / res["inductor_host_us"]
            res["own_us"] = res["overlap_host_us"] - res["inductor_host_us"]
            if args.private_graphs:
                with knobs.symm.patch(PRIVATE_GRAPHS=True):
                    stats, reserved = dict(private_graphs.STATS), torch.cuda.memory_reserved(device)
                    for _ in range(3):  # the key's eager run of the captured protocol, its capture, a replay
                        comp_o(x, *w)
                    measure(res, "private", cases["overlap"], device, args.calls)
                    if args.profile and rank == 0 and m in (sizes[0], 512, sizes[-1]):
                        profiles[f"{op}_M{m}_private_graphs"] = profile_text(cases["overlap"])
                    elif args.profile:
                        for _ in range(40):
                            cases["overlap"]()
                    common.synchronize(device)
                    res["private_stats"] = {k: v - stats[k] for k, v in private_graphs.STATS.items()}
                    res["private_reserved_mib"] = (torch.cuda.memory_reserved(device) - reserved) / 2**20
                res["private_ratio"] = res["private_host_us"] / res["inductor_host_us"]
                res["private_own_us"] = res["private_host_us"] - res["inductor_host_us"]
            if args.layers:
                layer_weights = [tuple(torch.randn_like(t) for t in w) for _ in range(args.layers)]

                def layers():
                    for lw in layer_weights:
                        comp_o(x, *lw)

                for private in (False, True):
                    name = "layers_private" if private else "layers_eager"
                    with knobs.symm.patch(PRIVATE_GRAPHS=private):
                        stats, reserved = dict(private_graphs.STATS), torch.cuda.memory_reserved(device)
                        for _ in range(3):
                            layers()
                        common.synchronize(device)
                        res[f"{name}_host_us"] = common.host_us(layers, device, calls=4, rounds=5) / args.layers
                        res[f"{name}_stats"] = {k: v - stats[k] for k, v in private_graphs.STATS.items()}
                        res[f"{name}_reserved_mib"] = (torch.cuda.memory_reserved(device) - reserved) / 2**20
                if rank == 0:
                    print(f"  {args.layers} layers: host us per call eager {res['layers_eager_host_us']:.1f}, private "
                          f"graphs {res['layers_private_host_us']:.1f} ({res['layers_private_stats']}, "
                          f"+{res['layers_private_reserved_mib']:.0f} MiB reserved)", flush=True)
            rows.append(res)
            if rank == 0:
                print(f"{op} M={m}: overlap {res['overlap_host_us']:.1f} us, inductor {res['inductor_host_us']:.1f} "
                      f"us, ratio {res['ratio']:.2f}, own {res['own_us']:.1f} us; 5-call bursts "
                      f"{res['overlap_host_us_5']:.1f} / {res['inductor_host_us_5']:.1f}; one call "
                      f"{res['overlap_single_us']:.1f} / {res['inductor_single_us']:.1f}; gpu "
                      f"{res['overlap_gpu_ms']:.3f} / {res['inductor_gpu_ms']:.3f} ms; paths {took}", flush=True)
                if args.private_graphs:
                    print(f"  private graphs: {res['private_host_us']:.1f} us, ratio {res['private_ratio']:.2f}, own "
                          f"{res['private_own_us']:.1f} us; 5-call bursts {res['private_host_us_5']:.1f}; one call "
                          f"{res['private_single_us']:.1f}; gpu {res['private_gpu_ms']:.3f} ms; "
                          f"{res['private_stats']}, +{res['private_reserved_mib']:.0f} MiB reserved", flush=True)
            with knobs.symm.patch(PRIVATE_GRAPHS=False):
                if args.profile and rank == 0 and m in (sizes[0], 512, sizes[-1]):
                    profiles[f"{op}_M{m}"] = profile_text(cases["overlap"])
                elif args.profile:
                    for _ in range(40):
                        cases["overlap"]()
            common.synchronize(device)
            dist.barrier()
    costs = driver_costs(device)
    if rank == 0:
        print("driver and torch.cuda calls, host µs each:", costs, flush=True)
        write(args.out, rows, profiles, ws, shared, device, costs)
    common.shutdown()
    return 0


def measure(res: dict, name: str, fn, device, calls: int) -> None:
    res[f"{name}_host_us"] = common.host_us(fn, device, calls=calls, rounds=5)
    res[f"{name}_host_us_5"] = common.host_us(fn, device, calls=5, rounds=5)
    res[f"{name}_single_us"] = single_us(fn, device)
    res[f"{name}_gpu_ms"] = common.allreduce_max([common.events_ms(fn, 20)], device)[0]


def write(out: Path, rows, profiles, ws, shared, device, costs) -> None:
    out.mkdir(parents=True, exist_ok=True)
    info = common.machine_info(device, ws)
    info["ranks_share_one_gpu"] = shared
    headers = ["graph", "M", "torch.mm host µs", "Inductor + NCCL host µs", "overlap host µs", "ratio",
               "overlap's own µs", "5-call bursts: overlap / Inductor µs", "one call on an idle GPU: overlap / Inductor µs",
               "GPU ms: overlap / Inductor", "paths"]
    private = any("private_host_us" in r for r in rows)
    if private:
        headers[7:7] = ["private graphs: host µs", "ratio", "own µs", "GPU ms", "MiB more reserved"]
    table = [[r["op"], r["M"], f"{r['torch.mm_host_us']:.1f}", f"{r['inductor_host_us']:.1f}",
              f"{r['overlap_host_us']:.1f}", f"{r['ratio']:.2f}×", f"{r['own_us']:.1f}",
              *([f"{r['private_host_us']:.1f}", f"{r['private_ratio']:.2f}×", f"{r['private_own_us']:.1f}",
                 f"{r['private_gpu_ms']:.3f}", f"{r['private_reserved_mib']:.0f}"] if private else []),
              f"{r['overlap_host_us_5']:.1f} / {r['inductor_host_us_5']:.1f}",
              f"{r['overlap_single_us']:.1f} / {r['inductor_single_us']:.1f}",
              f"{r['overlap_gpu_ms']:.3f} / {r['inductor_gpu_ms']:.3f}",
              ", ".join(f"{k} {v}" for k, v in sorted(r["paths"].items()))] for r in rows]
    text = (f"`{common.command_line(ws)}`\n\n{common.info_markdown(info)}\n\n"
            + common.markdown_table(headers, table) + "\n\nHost µs per call of the operations an op call is made of "
            "(rank 0, 2000 calls each, while the other ranks do the same):\n\n"
            + common.markdown_table(["operation", "µs"], [[k, f"{v:.2f}"] for k, v in costs.items()]) + "\n")
    layered = [r for r in rows if "layers_private_host_us" in r]
    if layered:
        text += ("\nEach op called in turn with one weight per layer (the same key at as many addresses), host µs per "
                 "call (calls of all layers / layers), Inductor's single-op figure beside it:\n\n" + common.markdown_table(
                     ["graph", "M", "Inductor + NCCL host µs", "eager overlap µs", "private graphs µs", "ratio to Inductor",
                      "private graphs' replays / captures / eager runs", "MiB more reserved"],
                     [[r["op"], r["M"], f"{r['inductor_host_us']:.1f}", f"{r['layers_eager_host_us']:.1f}",
                       f"{r['layers_private_host_us']:.1f}", f"{r['layers_private_host_us'] / r['inductor_host_us']:.2f}×",
                       "{replays} / {captures} / {eager}".format(**r["layers_private_stats"]),
                       f"{r['layers_private_reserved_mib']:.0f}"] for r in layered]) + "\n")
    (out / "host.md").write_text(text)
    common.write_json(out / "host.json", {"info": info, "rows": rows, "driver_costs_us": costs})
    for name, prof in profiles.items():
        (out / f"profile_{name}.txt").write_text(prof)
    print(text)


if __name__ == "__main__":
    raise SystemExit(main())
