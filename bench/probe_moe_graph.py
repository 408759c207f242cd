"""Probe: ``moe_experts`` on ``symm`` eager vs captured in a CUDA graph, per combine transport (not a test).

    torchrun --nproc-per-node=N bench/probe_moe_graph.py [--configs deepseek,mixtral-decode]
        [--transports ce,ce-only,sm]

For each ``bench_moe.py`` config (balanced routing) and ``knobs.moe.TRANSPORT``: two eager calls, one
captured, then the replay's output poisoned, replayed and checked against the eager NCCL baseline;
eager and replay times (CUDA events around one call after a barrier, median of 10, max over ranks),
and the baseline (NCCL all-to-all + ``torch._grouped_mm``) eager and captured. Found the slow
copy-out of the comm kernel in replays (2×H200, 2026-11-30: DeepSeek-like ``ce`` 8.96 ms replayed vs
``ce-only`` 5.65), which is why a captured call takes ``ce-only``; with ``--transports`` other than
``ce-only`` the captured call now takes ``ce-only`` anyway (``moe_symm.py``), so this probe compares
the transports of the eager calls against that.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common  # noqa: E402
from bench.bench_moe import Problem  # noqa: E402

import torch  # noqa: E402

import overlap_backend  # noqa: E402,F401


def captured(fn):
    fn()
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--configs", default="deepseek,mixtral-decode")
    p.add_argument("--transports", default="ce,ce-only,sm")
    args = p.parse_args()
    rank, ws, device = common.init_distributed("cuda")
    from overlap_backend.spec import knobs

    for cfg in args.configs.split(","):
        prob = Problem(cfg, "balanced", rank, ws, device)
        ref = prob.baseline()
        for transport in args.transports.split(","):
            knobs.moe.set(TRANSPORT=transport)
            graph, out = captured(lambda: prob.ours("symm"))
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            err = common.allreduce_max([common.rel_err(out.float(), ref.float())], device)[0]
            eager, replay = (common.together_ms(lambda: prob.ours("symm")), common.together_ms(graph.replay))
            del graph, out
            if rank == 0:
                print(f"{cfg:15s} {transport:8s} eager {eager:.3f} ms  replay {replay:.3f} ms  rel err {err:.1e}",
                      flush=True)
        graph, _ = captured(prob.baseline)
        eager, replay = common.together_ms(prob.baseline), common.together_ms(graph.replay)
        del graph
        if rank == 0:
            print(f"{cfg:15s} baseline eager {eager:.3f} ms  replay {replay:.3f} ms", flush=True)
    common.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
