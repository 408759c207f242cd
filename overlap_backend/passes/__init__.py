"""Rewrite passes, one module each (``ag_mm``, ``mm_rs``, ``cta_pipeline``, ``tp_experts/``, ``mm_ar``, ``moe/``), run in
order by :class:`~.manager.PassManager`.

The helpers they share, by topic: ``fx`` (node access and surgery), ``sizes`` (symbolic sizes),
``collectives`` (the collective patterns), ``matmuls``, ``preconditions`` (the ``require_*`` checks),
``lowerings`` (which lowering a match gets), ``rejected`` (why a match is left alone), ``epilogue`` /
``prologue`` (what an op computes after its GEMM / before its gather). ``manager`` sits above them all.
"""

from __future__ import annotations

from .manager import GraphReport, MatchRecord, OverlapPass, PassContext, PassManager, Rejected


def _registry() -> dict[str, type[OverlapPass]]:
    from .ag_mm import AgMmPass
    from .cta_pipeline import CtaPipelinePass
    from .mm_ar import MmArPass
    from .mm_rs import MmRsPass
    from .tp_experts import TpExpertsPass
    from .moe import MoePass

    # Order matters: an all-gather feeding a matmul whose result is reduce-scattered is claimed by
    # ag_mm first (the gather is on the critical path of both). cta_pipeline (off by default: not
    # in config.DEFAULT_PASS_ORDER) runs before mm_ar, whose mm -> all_reduce is the MLP's tail;
    # moe_tp_experts takes the experts' all-reduces (no matmul feeds them) before mm_ar would refuse them.
    return {p.name: p for p in (AgMmPass, MmRsPass, CtaPipelinePass, TpExpertsPass, MmArPass, MoePass)}


def available_passes() -> tuple[str, ...]:
    """The registered passes in run order: ``config.PASS_NAMES``, which the config validates against."""
    return tuple(_registry())


def build_manager(names: tuple[str, ...], config=None) -> PassManager:
    """The manager running ``names`` in registry order. With ``config`` whose cost model is not
    ``off`` and whose passes were not named by the user, ``cta_pipeline`` joins as a model-gated
    pass: it looks only where the model is active and rewrites only where it predicts a win."""
    reg = _registry()
    gated = frozenset()
    if config is not None and config.cost_model != "off" and not config.passes_named and "cta_pipeline" not in names:
        gated = frozenset({"cta_pipeline"})
    return PassManager([reg[n] for n in reg if n in names or n in gated], gated)


__all__ = [
    "GraphReport", "MatchRecord", "OverlapPass", "PassContext", "PassManager", "Rejected",
    "available_passes", "build_manager",
]
