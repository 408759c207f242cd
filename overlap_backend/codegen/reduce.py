"""One-shot all-reduce's sum: ``out = own + sum(recv[p] for every peer p)`` once each peer's flag says
its whole partial arrived (small M, where one round trip beats reduce-scatter + all-gather)."""

import triton
import triton.language as tl

from .flags import OP_AR_ONESHOT, wait_flag
from .tiles import load_rows, store_rows


@triton.jit
def oneshot_sum_kernel(
    own_ptr, recv_ptr, out_ptr, recv_flags_ptr, epoch, claim_ptr, report_ptr, timeout_ns,
    rank, M, N,
    WS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, AVERAGE: tl.constexpr, TIMED: tl.constexpr,
):
    offs_m = tl.program_id(0) * BM + tl.arange(0, BM)
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
    rows_ok = offs_m < M
    acc = load_rows(own_ptr, offs_m, rows_ok, offs_n, N, N).to(tl.float32)
    for p in range(1, WS):
        peer = (rank + p) % WS
        wait_flag(recv_flags_ptr + peer, epoch, claim_ptr, report_ptr, OP_AR_ONESHOT, rank, peer, 1, timeout_ns, TIMED)
        acc += load_rows(recv_ptr, peer * M + offs_m, rows_ok, offs_n, N, N).to(tl.float32)
    if AVERAGE:
        acc = acc / WS
    store_rows(out_ptr, offs_m, rows_ok, offs_n, N, N, acc)


def launch(own, recv, out, recv_flags, epoch, status, timeout_ns, rank, ws, average, timed=True):
    """``own``, ``out``: [M, N]; ``recv``: [ws, M, N] (slot p written by peer p)."""
    M, N = own.shape
    BM, BN = 32, 256
    grid = (triton.cdiv(M, BM), triton.cdiv(N, BN))
    oneshot_sum_kernel[grid](
        own, recv, out, recv_flags, epoch, *status, timeout_ns, rank, M, N,
        WS=ws, BM=BM, BN=BN, AVERAGE=average, TIMED=timed, num_warps=4,
    )
    return out
