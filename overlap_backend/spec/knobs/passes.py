"""Tunables of the rewrite passes (``overlap_backend/passes/``)."""

from .base import Knobs

passes = Knobs(
    "passes",
    # The size the cost model prices a data-dependent (unbacked) size at: such a size has no hint and
    # the model needs a number, so it takes a typical token count.
    UNBACKED_SIZE_HINT=4096,
    # ag_mm's prologue: a longer chain of row-wise ops after a gather is not a prologue worth reasoning
    # about (a bound on the walk, well above the norms and casts models put there).
    PROLOGUE_MAX_NODES=64,
    # Epilogue capture: how many users below a value the root of an activation pattern may lie (a bound
    # on the search that the decomposed GELU / SiLU / SwiGLU patterns, with their casts, fit within).
    EPILOGUE_PATTERN_DEPTH=12,
)
