"""Tunables of the runtime subsystem."""

from .base import Knobs

runtime = Knobs(
    "runtime",
)
