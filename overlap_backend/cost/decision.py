"""The cost model's decision for one match, and the calibration every rank of its group decides from.

:func:`decide` turns a :func:`~.model.predict` into what the pass writes (:class:`Decision`): rewrite
or keep the match plain (with the model's reason), the lowering and the knobs the model chose. Every
rank must make the same decision (no deadlock by construction): the inputs are shapes, dtype, group
size, config and a calibration that the ranks agreed on (:func:`calibration_for`), and the model is
pure arithmetic on them.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import calibration
from .calibration import DEFAULTS, Calibration
from .model import Problem, predict

log = logging.getLogger("overlap_backend")


def active(config, device_type: str) -> bool:
    """Does the model decide for a match on ``device_type`` tensors? ``on``: always; ``auto``: on
    CUDA (the CPU/gloo path exists for testing and keeps rewriting every match); ``off``: never."""
    return config.cost_model == "on" or (config.cost_model == "auto" and device_type == "cuda")


@dataclass
class Decision:
    """What the pass writes: whether to rewrite, the lowering and knobs; ``cost`` for the report."""

    rewrite: bool
    lowering: str
    reason: str
    cost: dict[str, Any] | None
    stages: int | None = None  # cta_pipeline's ``stages`` argument
    comm_sms: int = -1  # moe_experts' ``comm_sms`` argument (-1: the OVERLAP_MOE_COMM_SMS setting)


def decide(ctx, problem: Problem, group_name: str, device_type: str, lowerings: Sequence[str], *,
           gated: bool = False, stages: int | str | None = None, comm_sms: int | str | None = None,
           captured: bool | None = None) -> Decision:
    """The model's decision for one match that passed its preconditions.

    ``lowerings``: the candidates, the pass's own choice first (what runs when the model is not
    active); with ``OVERLAP_LOWERING=auto`` and a symm-capable group, ``["symm", "p2p"]``.
    ``stages`` / ``comm_sms``: the config's value, ``"auto"`` to let the model pick. ``captured``:
    is the match replayed from a CUDA graph (None: the graph's ``ctx.cuda_graphs``)?
    """
    cfg = ctx.config
    mode, on = cfg.cost_model, active(cfg, device_type)
    fixed_stages = None if stages == "auto" else stages
    fixed_sms = None if comm_sms in ("auto", None) else comm_sms
    default_stages = 2 if stages == "auto" else stages
    try:
        cal = calibration_for(group_name, device_type, cfg.cache_dir, agree=on)
        pred = predict(problem, cal, lowerings, stages=fixed_stages, comm_sms=fixed_sms,
                       cuda_graphs=getattr(ctx, "cuda_graphs", False) if captured is None else captured)
    except Exception as e:  # noqa: BLE001 - the same inputs fail the same way on every rank
        log.warning("overlap cost model: no prediction for %s (%s: %s)", problem.op, type(e).__name__, e)
        cost = {"mode": mode, "active": on, "error": f"{type(e).__name__}: {e}"}
        if gated:
            return Decision(False, lowerings[0], f"cost model: no prediction ({type(e).__name__}: {e})", cost)
        return Decision(True, lowerings[0], "rewritten", cost, default_stages)
    if not on:
        plan = next((p for p in pred.plans if p.lowering == lowerings[0]), pred.plans[0])
        cost = pred.to_json(mode, False, plan)
        if gated:  # not reached: a gated pass looks only where the model is active
            return Decision(False, lowerings[0], "cost model: not active here", cost)
        return Decision(True, lowerings[0], "rewritten", cost, default_stages)
    best = pred.best
    cost = pred.to_json(mode, True, best)
    if not pred.wins:
        return Decision(False, best.lowering, pred.reason(), cost)
    chosen = comm_sms == "auto" and best.lowering == "symm" and best.comm_sms is not None
    chosen_sms = best.comm_sms if chosen else -1
    return Decision(True, best.lowering, "rewritten", cost, best.stages or default_stages, chosen_sms)


# -------------------------------------------------------------------------- the agreed calibration
_agreed: dict[tuple, Calibration] = {}
_agreed_lock = threading.Lock()


def calibration_for(group_name: str, device_type: str, cache_dir: str | None, agree: bool = True) -> Calibration:
    """The calibration the passes use for a match on ``group_name`` with tensors on ``device_type``.

    CPU (gloo) groups use the built-in CPU numbers: a constant, the same on every rank. CUDA: this
    process loads the cache file of its key (``calibration.load_or_default``), and then, because a
    decision made from different numbers on different ranks would be a different graph on different
    ranks (a deadlock), the ranks agree: one ``all_gather_object`` per group and process (cached, at
    compile time, at the same point on every rank, as ``symm.group_support``), and every rank uses
    the calibration of the group's first rank. Ranks may hold different files (a node without a
    cache, another GPU model, a file written between two ranks' loads); they never decide
    differently. ``agree=False`` (the model only reports, it decides nothing): the local numbers.
    """
    if device_type != "cuda":
        return DEFAULTS["cpu"]
    cache = (group_name, cache_dir, agree)
    with _agreed_lock:
        if cache in _agreed:
            return _agreed[cache]
    local = calibration.load_or_default(cache_dir)
    cal = _agree(group_name, local) if agree else local
    with _agreed_lock:
        _agreed[cache] = cal
    return cal


def _agree(group_name: str, local: Calibration) -> Calibration:
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.distributed_c10d import _resolve_process_group

    group = _resolve_process_group(group_name)
    if "fake" in str(dist.get_backend(group)).lower():
        return local  # one process: nobody to disagree with
    with unset_fake_temporarily():
        objs: list[Any] = [None] * group.size()
        dist.all_gather_object(objs, local.to_json(), group=group)
    first = Calibration.from_json(objs[0])
    if objs[0] != local.to_json():
        log.info("overlap cost model: group %s uses its first rank's calibration %s (%s); this rank had %s (%s)",
                 group_name, first.key, first.source, local.key, local.source)
    return dataclasses.replace(first, source=f"agreed:rank0 ({first.source})")


def reset() -> None:
    """Forget the agreed calibrations (tests)."""
    with _agreed_lock:
        _agreed.clear()


__all__ = ["Decision", "active", "calibration_for", "decide", "reset"]
