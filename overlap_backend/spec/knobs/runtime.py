"""Tunables of the runtime outside the symm, CTA and MoE lowerings."""

from .base import Knobs

runtime = Knobs(
    "runtime",
    # Poll period of the stream-wait watchdog (runtime/watchdog.py): an overdue call is reported at most
    # this late, and each poll is a few host reads.
    WATCHDOG_POLL_S=0.05,
    # Period of the compile-time configuration check's reads of a peer's key that differs from this rank's
    # (rank_config.py; a peer may not have written its new one yet).
    RANK_CONFIG_POLL_S=0.02,
)
