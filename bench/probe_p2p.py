"""Where does the p2p lowering's time go? One ring shift, NCCL's own all-gather, host cost of ag_mm.

    torchrun --nproc-per-node=4 bench/probe_p2p.py

Prints, per message size: the time of one ring shift through ``batch_isend_irecv`` (what each
p2p step issues) and its bandwidth, the same through plain ``isend``/``irecv``, NCCL's
all-gather of ws messages; then the host (CPU) time and GPU time of one ``overlap.ag_mm`` call at
the decode and a DESIGN.md shape, to tell launch/host overhead from transfer time.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist

import overlap_backend  # noqa: F401
from overlap_backend.runtime.p2p import Ring


def cuda_time(fn, reps=30, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    t = torch.tensor(statistics.median(times), device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def host_time(fn, reps=30):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
    return statistics.median(times)


def main():
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    group = dist.group.WORLD
    ring = Ring(group.group_name)
    rows = []
    for mib in (2, 16, 64):
        n = mib * 2**20 // 2
        send = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        recv = torch.empty_like(send)

        def shift():
            ring.wait(ring.shift(send, recv))

        def plain():
            reqs = [dist.isend(send, (rank + 1) % ws), dist.irecv(recv, (rank - 1) % ws)]
            for r in reqs:
                r.wait()

        out = torch.empty(ws * n, device="cuda", dtype=torch.bfloat16)
        t_shift, t_plain = cuda_time(shift), cuda_time(plain)
        t_ag = cuda_time(lambda: dist.all_gather_into_tensor(out, send))
        rows.append((mib, t_shift, mib / 1024 / (t_shift / 1e3), t_plain, t_ag, host_time(shift)))
    if rank == 0:
        print(f"ring shift, {ws} ranks (ms; GB/s = MiB moved per rank / time)")
        print("MiB | batch_isend_irecv ms | GiB/s | isend/irecv ms | NCCL all-gather of ws msgs ms | host ms per shift")
        for r in rows:
            print(" | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r))

    gn = group.group_name
    for m, k, n in ((512, 8192, 7168), (4096, 8192, 7168)):
        shard = torch.randn(m // ws, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)

        def ours():
            torch.ops.overlap.ag_mm(shard, [w], [None], 0, gn, "p2p", False)

        def mm_only():
            torch.mm(torch.cat([shard] * ws), w)

        g, h, base = cuda_time(ours), host_time(ours), cuda_time(mm_only)
        if rank == 0:
            print(f"ag_mm M={m} K={k} N={n}: GPU {g:.3f} ms, host {h:.3f} ms per call, cat+mm alone {base:.3f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
