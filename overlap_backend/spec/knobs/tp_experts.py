"""Tunables of ``overlap::moe_tp_experts`` / ``moe_tp_experts_backward`` (``runtime/tp_experts_p2p.py``)."""

from .base import Knobs

tp_experts = Knobs(
    "tp_experts",
    # Token bands per call: band b's all-reduce travels while band b+1's expert GEMMs run, so more bands
    # hide more of the communication but make smaller GEMMs and one more host read of counts each.
    BANDS=4,
    # A band holds at least this many tokens (fewer bands on short inputs): a band's fixed costs (a host
    # read, one GEMM launch per expert, one collective) must stay small beside its work.
    MIN_BAND_TOKENS=1,
)
