"""A host thread that bounds what the GPU cannot: stream waits on peers' flags.

The ``symm`` kernels bound their own flag waits (``codegen/flags.py``), but a stream that waits in
``cuStreamWaitValue32`` has no timeout: the copy-engine pushes wait for each peer's READY flag, the
gathers and sends for flags that kernels raise. A peer that died or diverged leaves such a wait,
and everything queued after it on the compute stream, waiting forever, so the host hangs in its
next synchronisation instead of raising.

Every eager ``symm`` call therefore has the compute stream write its epoch into two words of
pinned, host-mapped memory: *started* when the stream reaches the call, *finished* once the call's
streams joined again (``GroupState.begin`` / ``end``). This thread reads them (plain host reads:
no CUDA call, so a CUDA-graph capture elsewhere in the process is never disturbed, and a call
costs two stream writes instead of two events); once a call has been started, not finished, for
``limit_s`` (counted from when the thread first saw it start, so time queued behind earlier work
does not count), the group's ``on_overdue`` runs -- for a ``GroupState`` that records the error and
releases every local flag, so the streams finish (with garbage) and the next call or
``check_status`` raises. It runs again on every poll until the call finishes, since a late peer may
lower a released flag again. Calls captured in a CUDA graph cannot write an epoch (the value would
be baked into the graph): a kernel counts their replays in two more words instead, and the group's
``progress`` adds both.

The thread knows nothing of CUDA: a watched group is a ``progress()`` callable returning
``(last call started, last call finished)`` (fakes in the CPU tests).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..spec import knobs

log = logging.getLogger("overlap_backend.symm")


@dataclass
class Watched:
    """One group: where its progress is read, what a call is called, what to do when it is overdue."""

    limit_s: float
    progress: Callable[[], tuple[int, int]]  # (epoch of the last call started, of the last finished)
    on_overdue: Callable[[str, float], None]  # (what the call was, seconds since it started)
    name: Callable[[int], str] = str  # the op of call (epoch) n
    _seen: int = 0  # the unfinished call seen started, and since when
    _seen_at: float = 0.0

    def poll(self, now: float) -> None:
        """Run ``on_overdue`` if the call in flight started more than ``limit_s`` ago."""
        started, finished = self.progress()
        if started <= finished:
            self._seen = 0
            return
        if started != self._seen:  # calls are ordered on the compute stream: this is the one in flight
            self._seen, self._seen_at = started, now
            return
        waited = now - self._seen_at
        if waited > self.limit_s:
            self.on_overdue(self.name(started), waited)


_watched: list[Watched] = []
_lock = threading.Lock()
_thread: threading.Thread | None = None
_stop = threading.Event()


def watch(limit_s: float, progress: Callable[[], tuple[int, int]], on_overdue: Callable[[str, float], None],
          name: Callable[[int], str] = str) -> Watched:
    """Watch a group from now on (``unwatch`` when it is released)."""
    global _thread
    w = Watched(limit_s, progress, on_overdue, name)
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
    while not _stop.wait(knobs.runtime.WATCHDOG_POLL_S):
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
    """Stop the thread before the interpreter goes away. Registered when this module is imported,
    i.e. before ``symm.release_all``, so it runs after it (atexit is last-in, first-out): an exit
    that synchronises on a stalled call is still released."""
    _stop.set()
    if _thread is not None and _thread.is_alive():
        _thread.join(timeout=2 * knobs.runtime.WATCHDOG_POLL_S + 1)
