"""Smoke check of the symm lowering on N GPUs: each op once per transport, full tracebacks.

    torchrun --nproc-per-node=N bench/tools/smoke_symm.py

Prints, per op, the relative error against NCCL + an fp32 matmul, and the path the call took. Meant
for a first look on a new machine or after a change, before the tests and the benchmark.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.tools import common  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import overlap_backend  # noqa: E402,F401  registers torch.ops.overlap.*
from overlap_backend.runtime import symm  # noqa: E402
from overlap_backend.runtime.symm import lowering_helpers  # noqa: E402
from overlap_backend.spec import knobs  # noqa: E402


def main() -> int:
    rank, ws, device = common.init_distributed("cuda")
    gn = common.group_name()
    dt = torch.bfloat16
    torch.manual_seed(rank)
    shard = torch.randn(1024, 512, device=device, dtype=dt)
    w = torch.randn(384, 512, device=device, dtype=dt).t()
    a = torch.randn(2048, 512, device=device, dtype=dt)
    big = torch.randn(4096, 512, device=device, dtype=dt)

    def ref_ag():
        g = torch.empty(ws * 1024, 512, device=device, dtype=dt)
        dist.all_gather_into_tensor(g, shard)
        return g.float() @ w.float()

    def ref_ar(x):
        r = x.float() @ w.float()
        dist.all_reduce(r)
        return r

    cases = {
        "ag_mm": (lambda: torch.ops.overlap.ag_mm(shard, [w], [None], 0, gn, "symm", False)[1][0], ref_ag),
        "mm_rs": (lambda: torch.ops.overlap.mm_rs(a, w, None, [2048, 384], 0, "sum", gn, "symm"),
                  lambda: ref_ar(a).chunk(ws)[rank]),
        "mm_ar one-shot": (lambda: torch.ops.overlap.mm_ar(a[:64], w, None, "sum", gn, "symm"), lambda: ref_ar(a[:64])),
        "mm_ar rounds": (lambda: torch.ops.overlap.mm_ar(big, w, None, "sum", gn, "symm"), lambda: ref_ar(big)),
    }
    failed = 0
    for transport in ("ce", "peer"):
        knobs.symm.set(TRANSPORT=transport)
        for name, (op, ref) in cases.items():
            before = dict(lowering_helpers.PATHS)
            try:
                out = op()
                torch.cuda.synchronize()
                symm.check_status()
                err = common.rel_err(out, ref())
                ok = err <= 1e-2
                msg = f"rel err {err:.2e}"
            except Exception:  # noqa: BLE001 - a smoke test reports everything
                ok, msg = False, traceback.format_exc()
            took = {k: v - before.get(k, 0) for k, v in lowering_helpers.PATHS.items() if v != before.get(k, 0)}
            failed += not ok
            print(f"[rank {rank}] {transport:4s} {name:15s} {'PASS' if ok else 'FAIL'} {took} {msg}", flush=True)
            dist.barrier()
    dist.barrier()
    symm.release_all()
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
