"""The process's symm groups: each group's state, set up on first use, and its end (at exit, when its
process group is destroyed).

:func:`install_process_hooks` ties that end to the process: it registers :func:`release_all` at exit
and wraps ``dist.destroy_process_group``. ``runtime/__init__.py`` calls it once; nothing here does it
at import.
"""

from __future__ import annotations

import atexit
import gc
import logging
import sys
import threading

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _resolve_process_group

from . import support
from .diagnostics import SymmUnavailable
from .group import GroupState

log = logging.getLogger("overlap_backend.symm")

states: dict[tuple[str, int], GroupState] = {}  # (group name, device index) -> its state
fallback_reasons: dict[str, str] = {}  # group name -> why symm could not be set up (its ops run on p2p)
_states_lock = threading.Lock()


def state(group_name: str, device: torch.device) -> GroupState | None:
    """The group's state, set up on first use (collective); None where setup failed on any rank."""
    key = (group_name, device.index)
    if group_name in fallback_reasons:
        return None
    st = states.get(key)
    if st is not None:
        return st
    why = support.group_support(group_name)
    if why is None:
        try:
            with torch.cuda.device(device):
                st = GroupState(group_name, device)
        except SymmUnavailable as e:
            why = str(e)
    if why is not None:
        fallback_reasons[group_name] = why
        log.warning("overlap symm: group %r uses the p2p lowering: %s", group_name, why)
        return None
    with _states_lock:
        states[key] = st
    return st


def check_status() -> None:
    """Raise :class:`SymmTimeoutError` if a kernel of any group timed out (after a synchronize, this
    covers every call made so far)."""
    for st in list(states.values()):
        st.check_status()


def release_all() -> None:
    """Free every group's buffers (at exit; call it yourself before destroying process groups)."""
    with _states_lock:
        released = list(states.values())
        states.clear()
    if released and torch.cuda.is_available():
        torch.cuda.synchronize()
    for st in released:
        try:
            st.release()
        except Exception as e:  # noqa: BLE001 - at exit the context may be gone already
            log.debug("overlap symm: release: %s", e)


def drop_cuda_graphs() -> None:
    """Free the graphs of ``mode="reduce-overhead"`` (cudagraph trees) before the default group goes:
    a CUDA graph that captured NCCL work makes ``ncclCommDestroy`` hang (pytorch#115388), and under
    that mode the ``p2p`` fallback of the symm ops (like any collective) is captured. Seen on 2xH200:
    every replay right, then the ranks hung in ``destroy_process_group``. Only when Inductor's
    cudagraph trees were imported at all."""
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees is None:
        return
    gc.collect()  # compiled functions dropped by the caller still hold their graphs until collected
    try:
        trees.reset_cudagraph_trees()
    except Exception as e:  # noqa: BLE001 - a failure here must not stop the shutdown
        log.warning("overlap: freeing CUDA graphs before destroy_process_group failed: %s", e)


def _group_alive(group_name: str) -> bool:
    try:
        _resolve_process_group(group_name)
        return True
    except Exception:  # noqa: BLE001
        return False


def _on_group_destroyed() -> None:
    """After ``dist.destroy_process_group(group)``: drop states whose group no longer exists."""
    dead = [k for k in states if not _group_alive(k[0])]
    for k in dead:
        st = states.pop(k)
        torch.cuda.synchronize(st.device)
        st.release()
    for name in [g for g in support.support_verdicts if not _group_alive(g)]:
        support.forget_groups([name])
        fallback_reasons.pop(name, None)


def _forget_every_group() -> None:
    """Before the default group is destroyed: every state released, every verdict forgotten."""
    drop_cuda_graphs()
    release_all()
    support.support_verdicts.clear()
    support.shared_device.clear()
    fallback_reasons.clear()


_installed = False

# Callables run when any process group is destroyed, registered by modules that cache per-group
# objects (the private graphs): registry cannot import them without an import cycle.
on_destroy: list = []


def install_process_hooks() -> None:
    """Release every group's buffers at exit, and on ``dist.destroy_process_group``: all of them (and
    the cudagraph trees, and p2p's groups) before the default group goes, those of a destroyed
    subgroup after it. Once per process; later calls do nothing."""
    global _installed
    if _installed:
        return
    _installed = True
    # The watchdog's own exit hook must run after release_all, which may wait on a stalled call that
    # only the watchdog releases: atexit runs last-registered first, so import it (registering its
    # hook) before registering release_all.
    from .. import watchdog  # noqa: F401

    atexit.register(release_all)
    original = dist.destroy_process_group
    if getattr(original, "_overlap_hooked", False):
        return

    def destroy_process_group(group=None):
        from .. import checks, p2p

        checks.forget_checked()
        for forget in on_destroy:
            forget()
        if group is None:
            _forget_every_group()
            p2p._GROUPS.clear()
            return original(group)
        result = original(group)
        _on_group_destroyed()
        p2p.forget_destroyed_groups()
        return result

    destroy_process_group._overlap_hooked = True
    destroy_process_group.__wrapped__ = original
    dist.destroy_process_group = destroy_process_group
