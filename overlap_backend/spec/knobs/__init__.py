"""Every tunable of the backend, one set per subsystem (see :mod:`.base` for what a tunable is).

Read ``knobs.cta.K_CHUNKS``; change with ``with knobs.cta.patch(K_CHUNKS=8): ...``, several sets at once
with ``knobs.patch({"cta.K_CHUNKS": 8})``, from a benchmark's command line with
``knobs.set_from_text("cta.K_CHUNKS=8")``. :func:`knobs_hash` covers every set: importing this package
declares them all.
"""

from .base import Knobs, generation, knob_sets, knobs_hash, patch, set_from_text
from .codegen import codegen
from .cost import cost
from .cta import cta
from .moe import moe
from .passes import passes
from .runtime import runtime
from .symm import symm
from .tp_experts import tp_experts

__all__ = ["Knobs", "codegen", "cost", "cta", "generation", "knob_sets", "knobs_hash", "moe", "passes", "patch",
           "runtime", "set_from_text", "symm", "tp_experts"]
