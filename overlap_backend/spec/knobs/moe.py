"""Tunables of the moe subsystem."""

from .base import Knobs

moe = Knobs(
    "moe",
)
