"""Tunables of the symm lowering (read by the runtime and by the cost model)."""

from .base import Knobs

symm = Knobs(
    "symm",
    # mm_ar: one-shot (push the whole partial to every peer) up to this partial size in bytes.
    ONESHOT_MAX_BYTES=4 << 20,
)
