"""Run a function on N gloo ranks in fresh processes, each test with its own rendezvous.

``run_ranks(fn, world_size, *args)`` spawns ``world_size`` processes that join a process group
through a FileStore in a new temp dir (never a fixed port), call ``fn(rank, world_size, *args)``,
and send back its return value or traceback. A rank that dies, fails, or does not finish within
``timeout`` seconds (a deadlock) fails the test loudly, and every process is killed.

``run_batch(calls, world_size)`` runs several such functions one after another in ONE spawn (starting
the ranks and importing torch costs several seconds per spawn on the CI machine); each call's outcome is
kept apart, so one failing call fails only the tests that read it.

``OVERLAP_TEST_SHARED_GPU=1`` puts every rank of a ``backend="nccl"`` run on GPU 0 with a gloo
group instead (NCCL refuses two ranks on one GPU): the GPU tests of the multi-rank kernels and flag
protocol then run on a one-GPU machine. Their timings mean nothing there (the ranks' kernels take
turns on the GPU), their numerics and hangs do.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import traceback
from datetime import timedelta

from overlap_backend.tools.spawn import collect, dump_stacks_on_signal

# One intra-op thread per rank: the ranks share a 2-core CI machine. Inductor off by default
# (its C++ codegen costs ~25 s per graph there); Inductor tests set OVERLAP_INDUCTOR=1.
_RANK_ENV = {"OMP_NUM_THREADS": "1", "OVERLAP_INDUCTOR": "0"}
# What a rank process imports before it runs anything: ~3.5 s of CPU per process on the CI machine, paid once
# by a fork server instead of by every rank of every test (where CUDA is absent, see _context).
_PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "overlap_backend"]


def _context():
    """Where CUDA is absent, rank processes fork from a server that imported ``_PRELOAD`` once (a forked
    child has no CUDA context to lose, nor threads: importing them starts none); on GPU machines each rank is
    a fresh interpreter (``spawn``), as the GPU tests were measured."""
    import torch

    if torch.cuda.is_available():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def shared_gpu() -> bool:
    """Whether GPU runs put every rank on GPU 0 with gloo (``OVERLAP_TEST_SHARED_GPU=1``)."""
    return os.environ.get("OVERLAP_TEST_SHARED_GPU", "0") not in ("", "0")


def on_group_device(t, group):
    """``t`` where the group's collectives take it: on the CPU for a gloo group (a reference computed
    with collectives under ``OVERLAP_TEST_SHARED_GPU``); move the result back with ``.to(t.device)``."""
    import torch.distributed as dist

    return t.cpu() if "gloo" in str(dist.get_backend(group)) else t


def _worker(fn, rank, world_size, store_path, results, env, backend, args):
    # the caller's environment at the call (a fork server's children inherit the server's), then the ranks' own
    os.environ.clear()
    os.environ.update(env)
    dump_stacks_on_signal()
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        store = dist.FileStore(store_path, world_size)
        kwargs = {}
        if backend == "nccl" and shared_gpu():
            from overlap_backend.spec import knobs

            torch.cuda.set_device(0)
            backend = "gloo"
            knobs.symm.set(GROUP_BACKENDS=("nccl", "gloo"))  # symm's data path never uses the group's collectives
        elif backend == "nccl":
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

    ``backend="nccl"`` puts rank r on GPU r (all on GPU 0 over gloo under ``OVERLAP_TEST_SHARED_GPU``).
    """
    # OVERLAP_TEST_TIMEOUT_S caps every test's timeout (a device run under a shorter stage limit still
    # gets the stuck ranks' stacks, which are printed when the timeout is reached)
    cap = os.environ.get("OVERLAP_TEST_TIMEOUT_S")
    if cap:
        timeout = min(timeout, float(cap))
    ctx = _context()
    results = ctx.Queue()
    full_env = {**os.environ, **_RANK_ENV, **(env or {})}
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [
            ctx.Process(target=_worker, args=(fn, r, world_size, store_path, results, full_env, backend, args), daemon=True)
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        out, errors = collect(procs, results, timeout)
        if errors:
            raise AssertionError("\n".join(errors))
        return [out[r] for r in range(world_size)]


def _batch_worker(rank, world_size, calls):
    """Each ``(fn, args)`` of ``calls`` in order on this rank: ``(True, value)`` or ``(False, traceback)``."""
    out = []
    for fn, args in calls:
        try:
            out.append((True, fn(rank, world_size, *args)))
        except Exception:  # noqa: BLE001 - reported to the tests that read this call
            out.append((False, traceback.format_exc()))
    return out


class BatchResult:
    """The per-rank results of one call of a :func:`run_batch`; :meth:`get` raises if it failed on any rank."""

    def __init__(self, name: str, per_rank: list):
        self.name, self.per_rank = name, per_rank

    def get(self) -> list:
        errors = [f"rank {r} failed in {self.name}:\n{v}" for r, (ok, v) in enumerate(self.per_rank) if not ok]
        if errors:
            raise AssertionError("\n".join(errors))
        return [v for _, v in self.per_rank]


def run_batch(calls: dict, world_size: int, *, timeout: float = 300, env: dict | None = None,
              backend: str = "gloo") -> dict:
    """``{name: BatchResult}`` of ``calls`` (``{name: (fn, args)}``, each ``fn(rank, world_size, *args)``),
    run one after another in one process group. A call that raises does not stop the next ones."""
    names = list(calls)
    per_rank = run_ranks(_batch_worker, world_size, [calls[n] for n in names], timeout=timeout, env=env,
                         backend=backend)
    return {n: BatchResult(n, [per_rank[r][i] for r in range(world_size)]) for i, n in enumerate(names)}
