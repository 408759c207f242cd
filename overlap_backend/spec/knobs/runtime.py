"""Tunables of the runtime outside the symm, CTA and MoE lowerings."""

from .base import Knobs

runtime = Knobs(
    "runtime",
    # Poll period of the stream-wait watchdog (runtime/watchdog.py): an overdue call is reported at most
    # this late, and each poll is a few host reads.
    WATCHDOG_POLL_S=0.05,
)
