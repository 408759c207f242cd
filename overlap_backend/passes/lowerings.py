"""Which lowering a match gets: the pass's own choice for its group, the candidates the cost model
may pick from, and the one written into the graph."""

from __future__ import annotations

from .rejected import Rejected


def choose_lowering(ctx, group_name: str, device_type: str) -> str:
    """The lowering for a match on ``device_type`` tensors, identical on every rank of the group.

    ``auto`` takes ``symm`` when every rank of the group is a CUDA process on this node with peer
    access (``runtime.symm.group_support`` agrees on that with one collective per group, cached),
    else ``p2p``. An explicit choice is kept; ``symm`` falls back to ``p2p`` at run time, on every
    rank at once, where its setup fails. :class:`Rejected` where the op would end on ``p2p`` with
    CUDA tensors over a group that cannot send them point to point (gloo): the collective, which
    gloo does run on CUDA tensors, is left as it is.
    """
    from torch.distributed.distributed_c10d import _resolve_process_group

    from ..runtime import p2p, symm

    lowering = ctx.config.lowering
    if lowering == "auto":
        lowering = "symm" if symm.group_support(group_name) is None else "p2p"
    if device_type == "cuda" and not p2p.sends_cuda_tensors(_resolve_process_group(group_name)) and (
            lowering != "symm" or symm.group_support(group_name) is not None):
        raise Rejected(f"group {group_name!r} is a gloo group and gloo cannot send CUDA tensors point to point "
                       f"(the {lowering} lowering's path here): the collective is left as it is")
    return lowering


def lowering_candidates(ctx, lowering: str, symm_runs: bool = True) -> list[str]:
    """The lowerings the cost model may pick from, ``lowering`` (the pass's own choice) first: with
    ``OVERLAP_LOWERING=auto`` a symm-capable group may also run ``p2p``; an explicit lowering is
    kept. ``symm_runs=False``: the op's symm kernels would not run here (the runtime falls back to
    p2p), so the model prices p2p."""
    first = lowering if (lowering != "symm" or symm_runs) else "p2p"
    if ctx.config.lowering == "auto" and first == "symm":
        return ["symm", "p2p"]
    return [first]


def written_lowering(ctx, lowering: str, decision) -> str:
    """The lowering to write: an explicit ``OVERLAP_LOWERING`` as given, else the model's pick."""
    return lowering if ctx.config.lowering != "auto" else decision.lowering
