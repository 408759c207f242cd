"""``moe_experts``' row-count check where no Triton GEMM runs (the ``torch._grouped_mm`` form,
``runtime/moe_grouped.py``): every peer wrote its row count of x into this rank's ``MOE_CAP`` word
before its dispatch rows (its dispatch flag's stream write fences it, and the compute stream has waited
for that flag). One program compares them with this rank's and reports a mismatch through the status
word, as ``gate_up_kernel`` does after its arrival waits (docs/moe.md, limits of the symm lowering)."""

import triton
import triton.language as tl

from . import launcher
from .flags import MOE_CAP_FLAG_BASE, OP_MOE, RELEASED_VALUE, STATUS_MISMATCH, claim_and_report


@triton.jit
def check_caps_kernel(caps_ptr, claim_ptr, report_ptr, rank, cap, WS: tl.constexpr):
    for s in tl.static_range(WS):
        if s != rank:
            sent = tl.load(caps_ptr + s, volatile=True)
            if (sent != cap) & (sent != RELEASED_VALUE):  # (released: the watchdog's message says why)
                claim_and_report(claim_ptr, report_ptr, STATUS_MISMATCH, OP_MOE, rank, s + MOE_CAP_FLAG_BASE, sent,
                                 cap, 1)


def launch(caps, status, rank: int, ws: int, cap: int) -> None:
    """Check the peers' row counts ``caps`` [ws] against ``cap`` (``status``: the group's claim and report)."""
    claim, report = status
    launcher.launch(check_caps_kernel, (1,), caps, claim, report, rank, cap, WS=ws)
