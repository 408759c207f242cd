"""Run a function on N gloo ranks in fresh processes, each test with its own rendezvous.

``run_ranks(fn, world_size, *args)`` spawns ``world_size`` processes that join a process group
through a FileStore in a new temp dir (never a fixed port), call ``fn(rank, world_size, *args)``,
and send back its return value or traceback. A rank that dies, fails, or does not finish within
``timeout`` seconds (a deadlock) fails the test loudly, and every process is killed.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import tempfile
import time
import traceback
from datetime import timedelta

# One intra-op thread per rank: the ranks share a 2-core CI machine. Inductor off by default
# (its C++ codegen costs ~25 s per graph there); Inductor tests set OVERLAP_INDUCTOR=1.
_RANK_ENV = {"OMP_NUM_THREADS": "1", "OVERLAP_INDUCTOR": "0"}


def _worker(fn, rank, world_size, store_path, results, env, backend, args):
    os.environ.update(env)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        store = dist.FileStore(store_path, world_size)
        kwargs = {}
        if backend == "nccl":
            torch.cuda.set_device(rank)
            kwargs["device_id"] = torch.device("cuda", rank)
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=120), **kwargs
        )
        try:
            out = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        results.put((rank, True, out))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        results.put((rank, False, traceback.format_exc()))


def run_ranks(
    fn, world_size: int, *args, timeout: float = 300, env: dict | None = None, backend: str = "gloo"
) -> list:
    """``[fn(0, world_size, *args), ..., fn(world_size - 1, ...)]``, each run in its own process.

    ``backend="nccl"`` puts rank r on GPU r.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    full_env = {**_RANK_ENV, **(env or {})}
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [
            ctx.Process(target=_worker, args=(fn, r, world_size, store_path, results, full_env, backend, args), daemon=True)
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        out: dict[int, object] = {}
        errors: list[str] = []
        deadline = time.monotonic() + timeout
        try:
            while len(out) < world_size and not errors:
                try:
                    rank, ok, value = results.get(timeout=1)
                except queue.Empty:
                    dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in out]
                    if dead:
                        errors.append(f"ranks {dead} died with exit codes {[procs[r].exitcode for r in dead]}")
                    elif time.monotonic() > deadline:
                        missing = sorted(set(range(world_size)) - set(out))
                        errors.append(f"timed out after {timeout}s waiting for ranks {missing} (deadlock?)")
                    continue
                if ok:
                    out[rank] = value
                else:
                    errors.append(f"rank {rank} failed:\n{value}")
        finally:
            for p in procs:
                if errors:
                    p.kill()
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
        if errors:
            raise AssertionError("\n".join(errors))
        return [out[r] for r in range(world_size)]
