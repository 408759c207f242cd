"""Tunables of the runtime outside the symm, CTA and MoE lowerings."""

from .base import Knobs

runtime = Knobs(
    "runtime",
    # Poll period of the stream-wait watchdog (runtime/watchdog.py): an overdue call is reported at most
    # this late, and each poll is a few host reads.
    WATCHDOG_POLL_S=0.05,
    # The least the compile-time configuration check (rank_config.py) waits for the ranks of a group to record
    # the same configuration, whatever OVERLAP_TIMEOUT_S says: compile times differ between ranks more than
    # the run-time steps it bounds.
    RANK_CONFIG_MIN_WAIT_S=60.0,
)
