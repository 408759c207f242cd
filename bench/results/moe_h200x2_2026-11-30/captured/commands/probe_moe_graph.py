"""Diagnosis: where a captured moe_experts (deepseek-like) spends its time vs eager (profiler summary)."""
import sys, collections
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import common
from bench.bench_moe import Problem
import torch, torch.distributed as dist
import overlap_backend  # noqa
from torch.profiler import profile, ProfilerActivity

rank, ws, device = common.init_distributed("cuda")
prob = Problem("deepseek", "balanced", rank, ws, device)
fn = lambda: prob.ours("symm")
fn(); fn(); torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    fn()
for _ in range(3):
    g.replay(); fn()
torch.cuda.synchronize()
for label, run in (("eager", fn), ("graph", g.replay)):
    dist.barrier(); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            run()
        torch.cuda.synchronize()
    prof.export_chrome_trace(f"{sys.argv[1]}/moe_{label}_rank{rank}.json")
    if rank == 0:
        evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        agg = collections.defaultdict(lambda: [0, 0.0])
        for e in evs:
            agg[e.name[:70]][0] += 1
            agg[e.name[:70]][1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        print(f"== {label}: {len(evs)} device events")
        for k, (n, us) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:14]:
            print(f"  {n:4d} x {us/1000/3:8.3f} ms/iter  {k}")
dist.barrier()
dist.destroy_process_group()
