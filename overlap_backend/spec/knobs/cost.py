"""Tunables of the cost subsystem."""

from .base import Knobs

cost = Knobs(
    "cost",
)
