"""A host thread that bounds what the GPU cannot: stream waits on peers' flags.

The ``symm`` kernels bound their own flag waits (``codegen/flags.py``), but a stream that waits in
``cuStreamWaitValue32`` has no timeout: the copy-engine pushes wait for each peer's READY flag, the
gathers and sends for flags that kernels raise. A peer that died or diverged leaves such a wait,
and everything queued after it on the compute stream, waiting forever, so the host hangs in its
next synchronisation instead of raising.

Every ``symm`` call is therefore *watched*: it records an event when the compute stream reaches it
(start) and one when its streams have joined again (end). This thread polls the oldest unfinished
call of each watched group; once its start event has completed (so time spent queued behind
earlier work does not count) and its end has not within ``limit_s``, the group's ``on_overdue``
runs -- for a ``GroupState`` that records the error and releases every local flag, so the
streams finish (with garbage) and the next call or ``check_status`` raises. It runs again on
every poll until the call finishes, since a late peer may lower a released flag again.

The thread knows nothing of CUDA: a watched call is two objects with ``query()`` (``torch.cuda.Event``
on GPUs; fakes in the CPU tests).
"""

from __future__ import annotations

import atexit
import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("overlap_backend.symm")

POLL_S = 0.05  # poll period: the overdue report comes at most this late


@dataclass
class _Call:
    start: object  # .query() -> bool: the compute stream reached the call
    end: object  # .query() -> bool: the call's streams are done
    what: str
    started_at: float | None = None


@dataclass
class Watched:
    """The calls of one group, oldest first, and what to do when the oldest is overdue."""

    limit_s: float
    on_overdue: Callable[[str, float], None]  # (what the call was, seconds since it started)
    calls: collections.deque = field(default_factory=collections.deque)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, start, end, what: str) -> None:
        with self.lock:
            self.calls.append(_Call(start, end, what))
            # The thread may lag behind a fast caller: drop finished calls here as well (cheap queries).
            while len(self.calls) > 64 and self.calls[0].end.query():
                self.calls.popleft()

    def poll(self, now: float) -> None:
        """Drop finished calls; run ``on_overdue`` if the oldest unfinished one is past its limit."""
        with self.lock:
            while self.calls and self.calls[0].end.query():
                self.calls.popleft()
            if not self.calls:
                return
            head = self.calls[0]
            if head.started_at is None:
                if not head.start.query():
                    return  # still queued behind earlier work: not counted
                head.started_at = now
            waited = now - head.started_at
        if waited > self.limit_s:
            self.on_overdue(head.what, waited)


_watched: list[Watched] = []
_lock = threading.Lock()
_thread: threading.Thread | None = None
_stop = threading.Event()


def watch(limit_s: float, on_overdue: Callable[[str, float], None]) -> Watched:
    """Register a group; its calls are then added with ``Watched.add``."""
    global _thread
    w = Watched(limit_s, on_overdue)
    with _lock:
        _watched.append(w)
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_loop, name="overlap-symm-watchdog", daemon=True)
            _thread.start()
    return w


def unwatch(w: Watched) -> None:
    with _lock:
        if w in _watched:
            _watched.remove(w)


def _loop() -> None:
    while not _stop.wait(POLL_S):
        with _lock:
            groups = list(_watched)
        now = time.monotonic()
        for w in groups:
            try:
                w.poll(now)
            except Exception as e:  # noqa: BLE001 - a watchdog that dies would bring the hangs back
                log.error("overlap symm: watchdog: %s: %s", type(e).__name__, e)


@atexit.register
def _shutdown() -> None:
    """Stop the thread before the interpreter and the CUDA context go away, so that it is not inside
    an event query when they do. Registered when this module is imported, i.e. before
    ``symm.release_all``, so it runs after it (atexit is last-in, first-out): an exit that
    synchronises on a stalled call is still released."""
    _stop.set()
    if _thread is not None and _thread.is_alive():
        _thread.join(timeout=2 * POLL_S + 1)
