"""Rewrite passes, one module each, run in order by :class:`~.manager.PassManager`."""

from __future__ import annotations

from .manager import GraphReport, MatchRecord, OverlapPass, PassContext, PassManager, Rejected


def _registry() -> dict[str, type[OverlapPass]]:
    from .ag_mm import AgMmPass
    from .cta_pipeline import CtaPipelinePass
    from .mm_ar import MmArPass
    from .mm_rs import MmRsPass
    from .moe import MoePass

    # Order matters: an all-gather feeding a matmul whose result is reduce-scattered is claimed by
    # ag_mm first (the gather is on the critical path of both). cta_pipeline (off by default: not
    # in config.DEFAULT_PASS_ORDER) runs before mm_ar, whose mm -> all_reduce is the MLP's tail.
    return {p.name: p for p in (AgMmPass, MmRsPass, CtaPipelinePass, MmArPass, MoePass)}


def available_passes() -> tuple[str, ...]:
    return tuple(_registry())


def build_manager(names: tuple[str, ...]) -> PassManager:
    reg = _registry()
    return PassManager([reg[n] for n in reg if n in names])


__all__ = [
    "GraphReport", "MatchRecord", "OverlapPass", "PassContext", "PassManager", "Rejected",
    "available_passes", "build_manager",
]
