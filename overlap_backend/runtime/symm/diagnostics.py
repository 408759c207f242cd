"""What goes wrong in a symm group, in words: its exceptions, the flag a stream waits for, the
report a kernel's bounded wait leaves in the status words (``spec/symm_layout.py``)."""

from __future__ import annotations

from torch.distributed.distributed_c10d import _resolve_process_group

from ...spec import symm_layout as layout


class SymmUnavailable(RuntimeError):
    """Symmetric memory cannot be set up for a group (the op falls back to ``p2p``)."""


class SymmTimeoutError(RuntimeError):
    """A kernel gave up waiting for a peer's flag."""


class SymmMismatchError(SymmTimeoutError):
    """A kernel found that a peer called the op with sizes this rank's call does not match (the group
    is then unusable, as after a timeout)."""


def flag_before(seen: int, value: int) -> bool:
    """Whether a flag that reads ``seen`` is still short of ``value`` (int32 words compared as a
    stream wait does: ``(int32)(seen - value) < 0``)."""
    return (seen - value) % 2**32 >= 2**31


def describe_flag(word: int, nbands: int, ws: int) -> str:
    """What a stream wait on this rank's flag ``word`` (eager block) waits for, in words."""
    nbands = max(nbands, 1)
    if layout.READY <= word < layout.READY + layout.WS_MAX:
        return f"rank {word - layout.READY} to start this call (its READY flag)"
    if layout.AG_ARRIVED <= word < layout.RS_ARRIVED:
        p, b = divmod(word - layout.AG_ARRIVED, nbands)
        return f"band {b} of rank {p}'s shard to arrive"
    for lo, hi, text in (
            (layout.RS_ARRIVED, layout.GATHERED, "band {b} of rank {p}'s partial (round {rnd}) to arrive"),
            (layout.GATHERED, layout.DONE, "band {b} of rank {p}'s reduced rows (round {rnd}) to arrive"),
            (layout.DONE, layout.COUNTERS, "this rank's own tiles of band {b} of chunk {p} (round {rnd}) to finish")):
        if lo <= word < hi:  # [(round * ws + p) * nbands + b]
            slot, b = divmod(word - lo, nbands)
            rnd, p = divmod(slot, max(ws, 1))
            return text.format(b=b, p=p, rnd=rnd)
    if layout.MOE_ARRIVED <= word < layout.MOE_RETURNED:
        return f"rank {word - layout.MOE_ARRIVED}'s dispatched tokens to arrive"
    if layout.MOE_RETURNED <= word < layout.MOE_DONE:
        return f"rank {word - layout.MOE_RETURNED}'s expert results for this rank's tokens to come back"
    if layout.MOE_DONE <= word < layout.MOE_COUNTERS:
        return f"this rank's own expert tiles for source position {word - layout.MOE_DONE} to finish"
    if layout.MOE_CAP <= word < layout.MOE_CAP + layout.WS_MAX:
        return f"rank {word - layout.MOE_CAP}'s row count of x (MOE_CAP)"
    if word == layout.PEER_OK:
        return "no peer to have given up a call (PEER_OK)"
    return "a flag of this op"


def status_error(words, group_name: str, timeout_s: float) -> SymmTimeoutError | None:
    """The exception that a kernel's status words ``[1, op, rank, flag, seen, epoch, ...]`` stand for."""
    if not words[0]:
        return None
    kind, op, rank, flag, seen, epoch, nbands = (int(w) for w in words[:7])
    nbands = max(nbands, 1)
    if kind == layout.STATUS_MISMATCH and op == layout.OP_MOE:
        return SymmMismatchError(
            f"overlap symm: moe_experts on rank {rank} of group {group_name!r}: rank {flag - layout.MOE_CAP_FLAG_BASE} "
            f"called it with {seen} token rows (x), this rank with {epoch}. The symm lowering sizes every rank's "
            "slots by x's rows, which must be the same on every rank of the group (docs/moe.md); this call's output "
            "is garbage and the group is unusable.")
    ws = _resolve_process_group(group_name).size() if group_name else 0
    if flag >= layout.GATHER_FLAG_BASE:  # an mm_ar copy tile
        slot, band = divmod(flag - layout.GATHER_FLAG_BASE, nbands)
        what = (f"band {band} of rank {slot % ws}'s reduced rows (round {slot // ws}) to arrive" if ws else
                f"band {band} of gathered slot {slot} to arrive")
    elif flag >= layout.READY_FLAG_BASE:
        what = f"rank {flag - layout.READY_FLAG_BASE} to start this call (its READY flag)"
    elif op == layout.OP_AG_MM:
        what = f"band {flag % nbands} of rank {flag // nbands}'s shard to arrive"
    elif op == layout.OP_AR_ONESHOT:
        what = f"rank {flag}'s partial to arrive"
    elif op == layout.OP_CTA_STAGE1 and ws:
        block, j = divmod(flag, nbands)
        g, p = divmod(block, max(ws // 2, 1))
        what = f"K-chunk {j} of row group {g} from stage-0 rank {p} to arrive"
    elif op == layout.OP_CTA_TAIL:
        p, m = divmod(flag, nbands)
        what = f"the tail (partial products) of row block {m} from stage-0 rank {p} to arrive"
    elif op == layout.OP_CTA_COLLECT and ws:
        t, m = divmod(flag, nbands)
        what = f"row block {m} of the output from stage-1 rank {ws // 2 + t} to arrive"
    elif op == layout.OP_MOE:
        if flag >= layout.MOE_RETURN_FLAG_BASE:
            what = f"rank {flag - layout.MOE_RETURN_FLAG_BASE}'s expert results for this rank's tokens to come back"
        elif flag >= layout.MOE_DONE_FLAG_BASE:
            what = f"this rank's own expert tiles for source position {flag - layout.MOE_DONE_FLAG_BASE} to finish"
        else:
            what = f"rank {flag}'s dispatched tokens to arrive"
    elif ws:
        slot = flag // nbands
        what = f"band {flag % nbands} of rank {slot % ws}'s partial (round {slot // ws}) to arrive"
    else:
        what = f"slot {flag} to arrive"
    return SymmTimeoutError(
        f"overlap symm: {layout.OP_NAMES.get(op, op)} on rank {rank} of group {group_name!r} waited {timeout_s:g} s "
        f"(OVERLAP_TIMEOUT_S) on flag {flag}, for {what}: it read {seen}, expected >= {epoch}. "
        "A peer died, diverged (ran other ops) or is far behind; this call's output is garbage."
    )
