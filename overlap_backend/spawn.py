"""Collect what spawned rank processes report, without hanging on a dead or stuck rank.

Each rank puts ``(rank, ok, value)`` on ``results``: ``ok`` with its return value, or not ``ok``
with a traceback. The demo and the multi-process tests share this loop.
"""

from __future__ import annotations

import queue
import time


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
