"""Whether symm can run on a process group (the same verdict on every rank), and the SMs its
persistent kernels may hold there."""

from __future__ import annotations

import socket
import threading

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _resolve_process_group

from ...spec import knobs
from ...spec import symm_layout as layout
from .. import cuda as _cuda

support_verdicts: dict[str, str | None] = {}  # group name -> why symm cannot run on it (None: it can)
_support_lock = threading.Lock()
# Per group, the most of its ranks on one GPU (set by ``_agree_support``; 1: a GPU each). Where ranks share a GPU
# a device-to-device copy between their buffers runs as a driver kernel on the SMs, not on a copy engine, so the
# persistent kernels that spin on data those copies deliver must leave SMs free for them, all the sharing ranks'
# kernels together (knobs.symm.SHARED_DEVICE_FREE_SMS).
shared_device: dict[str, int] = {}


def _local_problem() -> str | None:
    if not torch.cuda.is_available():
        return "CUDA is not available"
    if (why := _cuda.import_error()) is not None:
        return why
    try:
        import triton  # noqa: F401
    except ImportError as e:
        return f"Triton is not installed ({e})"
    if torch.cuda.get_device_capability() < (9, 0):
        return f"{torch.cuda.get_device_name()} is not Hopper or newer (TMA tile kernels)"
    return None


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def group_support(group_name: str) -> str | None:
    """None when ``symm`` can run on this group, else why not. The same answer on every rank: for
    NCCL groups it is agreed with collectives (once per group, cached), so call it at the same
    point on every rank (the passes do: compile time)."""
    with _support_lock:
        if group_name in support_verdicts:
            return support_verdicts[group_name]
    group = _resolve_process_group(group_name)
    backend = str(dist.get_backend(group)).lower()
    if not any(b in backend for b in knobs.symm.GROUP_BACKENDS):
        why = f"group backend is {backend!r}, not NCCL"
    elif group.size() > layout.WS_MAX:
        why = f"group of {group.size()} ranks > {layout.WS_MAX} (one node)"
    else:
        why, shared = _agree_support(group)
        shared_device[group_name] = shared
    with _support_lock:
        support_verdicts[group_name] = why
    return why


def kernel_sms(group_name: str, sms: int) -> int:
    """The SMs the group's persistent kernels may hold (their grids' bound): all ``sms`` of the GPU; where ``n`` ranks
    of the group share a GPU, ``1/n`` of them less ``knobs.symm.SHARED_DEVICE_FREE_SMS``, so that the sharing ranks'
    spinning kernels together never hold the SMs the copies between them need (each holding all but the free ones,
    the other rank's kernels may take those: the likely reason the MoE op with a comm kernel hung at 2 ranks on one
    GPU). The same on every rank."""
    ranks = shared_device.get(group_name, 1)
    return max(1, (sms - knobs.symm.SHARED_DEVICE_FREE_SMS) // ranks) if ranks > 1 else sms


def ranks_per_device(infos) -> int:
    """The most of the ranks' ``(host, boot id, device, ...)`` that name one GPU (1: a GPU each)."""
    places = [tuple(info[:3]) for info in infos]
    return max(places.count(place) for place in places)


def forget_groups(names) -> None:
    """Drop the verdicts of groups ``names`` (destroyed: a later group may reuse a name)."""
    with _support_lock:
        for name in list(names):
            support_verdicts.pop(name, None)
            shared_device.pop(name, None)


def _agree_support(group) -> tuple[str | None, int]:
    """(why symm cannot run on ``group``, or None; the most of its ranks on one GPU)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():  # the passes may run under a fake mode; this needs real tensors
        local = _local_problem()
        device = torch.cuda.current_device() if local is None else -1
        infos = [None] * group.size()
        dist.all_gather_object(infos, (socket.gethostname(), _boot_id(), device, local), group=group)
        shared = ranks_per_device(infos)
        for rank, (_, _, _, why) in enumerate(infos):
            if why is not None:
                return f"rank {rank}: {why}", shared
        if len({(h, b) for h, b, _, _ in infos}) > 1:
            return "the group spans several nodes", shared
        no_peer = [
            info[2] for info in infos if info[2] != device and not _cuda.can_access_peer(device, info[2])
        ]
        verdicts = [None] * group.size()
        dist.all_gather_object(verdicts, no_peer, group=group)
        for rank, bad in enumerate(verdicts):
            if bad:
                return f"rank {rank} (cuda:{infos[rank][2]}) has no peer access to cuda:{bad}", shared
    return None, shared
