"""Tunables of CTA-pipelining (its symm schedule, read by the runtime and by the cost model)."""

from .base import Knobs

cta = Knobs(
    "cta",
    # K-chunks per stage-0 rank: a stage-1 CTA waits (and refills its pipeline) this often.
    K_CHUNKS=4,
    # GELU: the largest share of the first GEMM's columns stage-1 ranks compute themselves.
    GELU_SHARE_MAX=0.3,
)
