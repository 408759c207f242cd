"""Collect what spawned rank processes report, without hanging on a dead or stuck rank.

Each rank puts ``(rank, ok, value)`` on ``results``: ``ok`` with its return value, or not ``ok``
with a traceback. The demo and the multi-process tests share this loop.

A rank that does not report in time is asked for its Python stacks first (``SIGUSR1``, which
``dump_stacks_on_signal`` in the rank turned into a faulthandler dump to stderr), so a deadlock's
log shows where each stuck rank waits.
"""

from __future__ import annotations

import os
import queue
import signal
import time

STACK_DUMP_WAIT_S = 2.0


def dump_stacks_on_signal() -> None:
    """In a rank process: ``SIGUSR1`` prints every thread's Python stack to stderr, and so does a fatal
    signal (a segfault in a native library otherwise leaves only the rank's exit code, -11)."""
    import faulthandler

    faulthandler.enable(all_threads=True)
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)


def collect(procs, results, timeout: float) -> tuple[dict[int, object], list[str]]:
    """({rank: value} of the ranks that finished, errors); every process is joined (killed on an
    error: a rank that died, failed, or did not report within ``timeout`` seconds)."""
    world_size = len(procs)
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
                    _ask_for_stacks([procs[r] for r in missing])
                    errors.append(f"timed out after {timeout:.0f}s waiting for ranks {missing} (deadlock?)")
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
    return out, errors


def _ask_for_stacks(procs) -> None:
    """Ask stuck ranks to print their stacks (see ``dump_stacks_on_signal``), and give them a moment."""
    if not hasattr(signal, "SIGUSR1"):
        return
    asked = 0
    for p in procs:
        if p.is_alive() and p.pid:
            try:
                os.kill(p.pid, signal.SIGUSR1)
                asked += 1
            except OSError:
                pass
    if asked:
        time.sleep(STACK_DUMP_WAIT_S)
