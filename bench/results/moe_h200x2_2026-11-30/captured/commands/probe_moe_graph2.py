"""Diagnosis: captured vs eager moe_experts per combine transport (CUDA events, median of 10)."""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import common
from bench.bench_moe import Problem
import torch, torch.distributed as dist
import overlap_backend  # noqa
from overlap_backend.runtime import moe_symm

rank, ws, device = common.init_distributed("cuda")

def ms(fn, n=10):
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier(); torch.cuda.synchronize()
        a.record(); fn(); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[n // 2]

for cfg in ("deepseek", "mixtral-decode"):
    prob = Problem(cfg, "balanced", rank, ws, device)
    ref = prob.baseline()
    for transport in ("ce", "ce-only", "sm"):
        moe_symm.TRANSPORT = transport
        fn = lambda: prob.ours("symm")
        fn(); fn(); torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = fn()
        out.fill_(float("nan")); g.replay(); torch.cuda.synchronize()
        err = common.rel_err(out.float(), ref.float())
        e, gr = ms(fn), ms(g.replay)
        e, gr = common.allreduce_max([e, gr], device)
        if rank == 0:
            print(f"{cfg:15s} {transport:8s} eager {e:.3f} ms  graph {gr:.3f} ms  err {err:.1e}", flush=True)
        del g
    bg = torch.cuda.CUDAGraph()
    prob.baseline(); torch.cuda.synchronize()
    with torch.cuda.graph(bg):
        prob.baseline()
    b_e, b_g = common.allreduce_max([ms(prob.baseline), ms(bg.replay)], device)
    if rank == 0:
        print(f"{cfg:15s} baseline eager {b_e:.3f} ms  graph {b_g:.3f} ms", flush=True)
dist.barrier()
dist.destroy_process_group()
