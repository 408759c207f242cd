"""Tunables of the passes subsystem."""

from .base import Knobs

passes = Knobs(
    "passes",
)
