"""Tunables of the codegen subsystem."""

from .base import Knobs

codegen = Knobs(
    "codegen",
)
