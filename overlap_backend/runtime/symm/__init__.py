"""The ``symm`` lowering: symmetric peer buffers, epoch flags, copy-engine pushes, Triton tile kernels.

For a process group whose ranks are CUDA processes on one node with peer access. Per group, every
rank allocates (``cudaMalloc``, an allocation of its own) one *data* buffer and one *flag* buffer and
maps every peer's through legacy IPC handles (exchanged with ``all_gather_object``); a pinned,
device-mapped *status* buffer reports kernel timeouts. No multicast object is ever created. What the
kernels do not cover, and groups where setting up the buffers fails, fall back to the ``p2p``
lowering on every rank of the group at once (reason logged).

Modules: ``support`` (can a group run it), ``group`` (a group's buffers and one call's protocol),
``diagnostics`` (errors and reports in words), ``registry`` (the process's groups), ``lowering_helpers``
(what every op's lowering shares) and one module per op: ``ag_mm``, ``mm_rs``, ``mm_ar``. The flag
layout is ``spec/symm_layout.py``, the tunables ``knobs.symm``.
"""

from .diagnostics import SymmMismatchError, SymmTimeoutError, SymmUnavailable, describe_flag, status_error
from .group import GroupState, persistent
from .registry import check_status, drop_cuda_graphs, install_process_hooks, release_all, state
from .support import group_support, kernel_sms

__all__ = ["GroupState", "SymmMismatchError", "SymmTimeoutError", "SymmUnavailable", "check_status",
           "describe_flag", "drop_cuda_graphs", "group_support", "install_process_hooks", "kernel_sms",
           "persistent", "release_all", "state", "status_error"]
