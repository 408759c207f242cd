"""Probe: host time per ``symm`` op call (explains host-bound steps; not a test).

    torchrun --nproc-per-node=N bench/probes/probe_host.py [--profile] [--ab] [--launch-ab] [--graph] [--out FILE.json]

For the TP block's ops (batch 4 x seq 2048 tokens, hidden 4096, ffn 14336, bf16) and a decode
size (M=512): the host time of one op call (``time.perf_counter`` around ``CALLS`` calls that
are not waited for, after warm-up; the GPU queue is deep enough not to push back), next to the
same work done as NCCL collective + ``torch.mm``. ``--ab`` times the symm ops again with the stream
operations through cuda-python instead of the ctypes entry points (``runtime/cuda.py: _fast``), in
alternating rounds. ``--launch-ab`` does the same with ``codegen.launcher``'s fast launch path against Triton's own
launch path. ``--profile`` adds a cProfile of the ag_mm and mm_rs calls at the decode size
(top functions by cumulative and by own time), to say where the host time goes. ``--graph`` turns on
``knobs.symm.CAPTURE_ON_SYMM``, captures one ag_mm + one mm_rs at each size in a CUDA graph after
eager warm-up, and reports the host time per replay and the GPU time (CUDA events, median of 20) of a
replay next to the same two eager calls, and the same for the baseline pair (NCCL all-gather + mm,
mm + NCCL reduce-scatter): what captured calls save, and how they compare with captured NCCL.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.tools import common  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402

import overlap_backend  # noqa: E402,F401
from overlap_backend.spec import knobs  # noqa: E402

CALLS = 20
HIDDEN, FFN, TOKENS = 4096, 14336, 8192


def host_us(fn):
    """Host µs per call, max over ranks (``common.host_us``: 5 bursts of ``CALLS`` unwaited calls)."""
    return common.host_us(fn, torch.device("cuda", torch.cuda.current_device()), calls=CALLS, rounds=5)


def gpu_ms(fn):
    """Median GPU ms of ``fn`` over 20 calls (CUDA events, ``calibrate.timed_ms``), max over ranks."""
    from overlap_backend.tools.calibrate import timed_ms

    return common.allreduce_max([timed_ms(fn, 20)], torch.device("cuda", torch.cuda.current_device()))[0]


def _captured(fn):
    """``fn`` captured once in a CUDA graph (after the caller's eager warm-up)."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def graph_rows(tokens, cases, rank):
    """Eager ag_mm + mm_rs vs the same two calls captured once and replayed (CAPTURE_ON_SYMM), next to
    the baseline pair (NCCL all-gather + mm, mm + NCCL reduce-scatter) eager and captured."""
    from overlap_backend.runtime.symm import lowering_helpers
    from overlap_backend.spec import knobs

    def both():
        cases["ag_mm"]()
        cases["mm_rs"]()

    def nccl_both():
        cases["NCCL all_gather + mm"]()
        cases["mm + NCCL reduce_scatter"]()

    with knobs.symm.patch(CAPTURE_ON_SYMM=True):
        for _ in range(2):
            both()  # eager warm-up: group state, buffer, tuned configs
            nccl_both()
        before = dict(lowering_helpers.PATHS)
        graph = _captured(both)
        went = {k: v - before.get(k, 0) for k, v in lowering_helpers.PATHS.items() if v != before.get(k, 0)}
        nccl_graph = _captured(nccl_both)
    rows = [
        {"tokens": tokens, "case": "ag_mm + mm_rs eager", "host_us_per_call": host_us(both),
         "gpu_ms": gpu_ms(both)},
        {"tokens": tokens, "case": "ag_mm + mm_rs replay", "host_us_per_call": host_us(graph.replay),
         "gpu_ms": gpu_ms(graph.replay), "captured_paths": went},
        {"tokens": tokens, "case": "NCCL + mm pair eager", "host_us_per_call": host_us(nccl_both),
         "gpu_ms": gpu_ms(nccl_both)},
        {"tokens": tokens, "case": "NCCL + mm pair replay", "host_us_per_call": host_us(nccl_graph.replay),
         "gpu_ms": gpu_ms(nccl_graph.replay)},
    ]
    for r in rows:
        if rank == 0:
            print(f"tokens {tokens:5d}  {r['case']:28s} host {r['host_us_per_call']:8.1f} us/call, "
                  f"GPU {r['gpu_ms']:.3f} ms {r.get('captured_paths', '')}", flush=True)
    return rows


def _alternating(cases, tokens, rank, variants, select):
    """Host time of the ag_mm and mm_rs calls under each of ``variants`` (``select(variant)`` switches
    to it), in three alternating rounds, the median round kept; the caller restores the default."""
    rows = []
    for case in ("ag_mm", "mm_rs"):
        ab = {v: [] for v in variants}
        for _ in range(3):
            for variant in ab:
                select(variant)
                ab[variant].append(host_us(cases[case]))
        for variant, values in ab.items():
            us = sorted(values)[1]
            rows.append({"tokens": tokens, "case": f"{case} ({variant})", "host_us_per_call": us})
            if rank == 0:
                print(f"tokens {tokens:5d}  {case + ' (' + variant + ')':28s} host {us:8.1f} us/call "
                      f"(rounds {', '.join(f'{v:.0f}' for v in values)})", flush=True)
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--profile", action="store_true")
    p.add_argument("--ab", action="store_true")
    p.add_argument("--launch-ab", action="store_true",
                   help="time the symm ops with codegen.launcher's fast launch path and with Triton's own, alternating")
    p.add_argument("--graph", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rank, ws, device = common.init_distributed("cuda")
    group = dist.group.WORLD
    name = group.group_name
    dt = torch.bfloat16
    results = []
    for tokens in (TOKENS, 512):
        m = tokens // ws
        x = torch.randn(m, HIDDEN, device=device, dtype=dt)
        w_up = torch.randn(FFN // ws, HIDDEN, device=device, dtype=dt).t()  # nn.Linear layout
        h = torch.randn(tokens, FFN // ws, device=device, dtype=dt)
        w_down = torch.randn(HIDDEN, FFN // ws, device=device, dtype=dt).t()
        cases = {
            "ag_mm": lambda: torch.ops.overlap.ag_mm(x, [w_up], [None], 0, name, "symm", False),
            "ag_mm (gathered)": lambda: torch.ops.overlap.ag_mm(x, [w_up], [None], 0, name, "symm", True),
            "mm_rs": lambda: torch.ops.overlap.mm_rs(h, w_down, None, [tokens, HIDDEN], 0, "sum", name, "symm"),
            "NCCL all_gather + mm": lambda: funcol.wait_tensor(funcol.all_gather_tensor(x, 0, group)) @ w_up,
            "mm + NCCL reduce_scatter": lambda: funcol.wait_tensor(
                funcol.reduce_scatter_tensor(h @ w_down, "sum", 0, group)),
        }
        for case, fn in cases.items():
            us = host_us(fn)
            results.append({"tokens": tokens, "case": case, "host_us_per_call": us})
            if rank == 0:
                print(f"tokens {tokens:5d}  {case:28s} host {us:8.1f} us/call", flush=True)
        if args.ab:
            from overlap_backend.runtime import cuda as _cuda

            fast = _cuda._fast

            def stream_ops(variant):
                _cuda._fast = fast if variant == "ctypes" else (lambda: None)

            results += _alternating(cases, tokens, rank, ("ctypes", "cuda-python"), stream_ops)
            _cuda._fast = fast
        if args.launch_ab:
            from overlap_backend.codegen import launcher

            def launches(variant):
                knobs.codegen.set(FAST_LAUNCH=variant == "fast launch")

            results += _alternating(cases, tokens, rank, ("fast launch", "Triton launch"), launches)
            knobs.codegen.set(FAST_LAUNCH=True)
        if args.profile and tokens != TOKENS:
            for case in ("ag_mm", "mm_rs"):
                prof = cProfile.Profile()
                torch.cuda.synchronize()
                prof.enable()
                for _ in range(CALLS):
                    cases[case]()
                prof.disable()
                torch.cuda.synchronize()
                if rank == 0:
                    s = io.StringIO()
                    st = pstats.Stats(prof, stream=s)
                    st.sort_stats("cumulative").print_stats(45)
                    st.sort_stats("tottime").print_stats(25)
                    print(f"== cProfile of {CALLS} {case} calls, {tokens} tokens\n" + s.getvalue(), flush=True)
        if args.graph:
            results += graph_rows(tokens, cases, rank)
    if args.out and rank == 0:
        Path(args.out).write_text(json.dumps({"info": common.machine_info(device, ws), "results": results}, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
