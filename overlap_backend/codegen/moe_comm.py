"""``moe_experts`` communication consumer: a persistent kernel on a few SMs that ships finished
segments to their source ranks and copies the results that came back into ``out``.

Launched with ``OVERLAP_MOE_COMM_SMS`` CTAs on its own stream, next to the ``down_kernel``
producer (``moe_gemm.py``), which leaves that many SMs free.

- ``PUSH`` (SM transport): for each source position ``pos = 0 .. ws-2`` (source
  ``s = rank + 1 + pos``, the order in which the producer finishes them) every CTA waits (bounded)
  for ``done[pos]`` (the producer's last tile of that source) and for ``READY[s]`` (rank s started
  this call, so its combine slot is free), copies its share of the segment (staging rows
  ``recv_off[s] .. recv_off[s+1]``, contiguous) into rank s's combine slot ``rank`` through the
  peer mapping, and counts itself done; the last CTA raises rank s's ``returned[rank]`` flag
  (system-scope release after the stores). After any timed-out wait of this rank (the claimed
  status word) nothing is shipped: the peers time out and report instead of taking garbage.
- ``PULL``: for each peer ``d = rank - 1, rank - 2, ...`` (rank-1 computes this rank's rows first)
  wait (bounded) for ``returned[d]``, then copy combine slot ``d`` (``send_splits[d]`` rows) into
  ``out`` rows ``send_off[d] ..``.

Copies are flat: a segment is ``rows * H`` contiguous elements on both sides.
"""

import triton
import triton.language as tl

from . import launcher
from .flags import (MOE_DONE_FLAG_BASE, MOE_RETURN_FLAG_BASE, OP_MOE, READY_FLAG_BASE, count_tile_done,
                    wait_flag)
from .tiles import peer_buffer


@triton.jit
def copy_flat(src, dst, n, BLOCK: tl.constexpr):
    """This CTA's share (grid-stride) of ``dst[:n] = src[:n]``."""
    offs = tl.arange(0, BLOCK)
    step = tl.num_programs(0).to(tl.int64) * BLOCK
    start = tl.program_id(0).to(tl.int64) * BLOCK
    for base in range(start, n, step):
        idx = base + offs
        m = idx < n
        tl.store(dst + idx, tl.load(src + idx, mask=m), mask=m)


@triton.jit(do_not_specialize=["epoch"])  # per-call values: see launcher.py
def comm_kernel(
    stage_ptr, comb_ptr, out_ptr, peer_data_ptr, peer_flags_ptr, recv_off_ptr, send_off_ptr,
    done_ptr, pushed_ptr, ready_ptr, returned_ptr, epoch, claim_ptr, report_ptr, timeout_ns,
    rank, cap, H, comb_offset, returned_word,
    WS: tl.constexpr, BLOCK: tl.constexpr, PUSH: tl.constexpr, PULL: tl.constexpr, TIMED: tl.constexpr,
):
    if PUSH:
        for p in tl.static_range(WS - 1):
            src = (rank + 1 + p) % WS
            wait_flag(done_ptr + p, epoch, claim_ptr, report_ptr, OP_MOE, rank, MOE_DONE_FLAG_BASE + p, 1,
                      timeout_ns, TIMED)
            wait_flag(ready_ptr + src, epoch, claim_ptr, report_ptr, OP_MOE, rank, src + READY_FLAG_BASE, 1,
                      timeout_ns, TIMED)
            # A wait of this rank's kernels gave up in this call: its results are garbage, ship
            # nothing (the peers then time out too and report, instead of taking garbage).
            if tl.load(claim_ptr, volatile=True) == 0:
                lo = tl.load(recv_off_ptr + src).to(tl.int64)
                n = (tl.load(recv_off_ptr + src + 1) - lo) * H
                peer = peer_buffer(peer_data_ptr, src, 0, stage_ptr.dtype.element_ty)
                copy_flat(stage_ptr + lo * H, peer + comb_offset + (rank * cap).to(tl.int64) * H, n, BLOCK)
                flags = tl.load(peer_flags_ptr + src).to(tl.pointer_type(tl.int32))
                count_tile_done(pushed_ptr + p, flags + returned_word + rank, tl.num_programs(0), epoch, SYS=True)
    if PULL:
        for j in tl.static_range(1, WS):
            d = (rank + WS - j) % WS
            wait_flag(returned_ptr + d, epoch, claim_ptr, report_ptr, OP_MOE, rank, MOE_RETURN_FLAG_BASE + d, 1,
                      timeout_ns, TIMED)
            lo = tl.load(send_off_ptr + d).to(tl.int64)
            n = (tl.load(send_off_ptr + d + 1) - lo) * H
            copy_flat(comb_ptr + (d * cap).to(tl.int64) * H, out_ptr + lo * H, n, BLOCK)


def launch(stage, comb, out, peer_data, peer_flags, recv_off, send_off, done, pushed, ready, returned, epoch,
           status, timeout_ns, rank, ws, cap, comb_offset, returned_word, ctas, push=True, pull=True, timed=True,
           block=4096):
    """``stage`` [N_recv, H], ``comb`` [ws * cap, H] (this rank's combine region), ``out`` [N_send, H];
    ``comb_offset``: elements from a data buffer's start to its combine region; ``returned_word``:
    word index of the ``returned`` flags in a flag buffer; ``ctas``: the SM partition."""
    H = out.shape[1]
    launcher.launch(comm_kernel, (ctas,),
        stage, comb, out, peer_data, peer_flags, recv_off, send_off, done, pushed, ready, returned, epoch, *status,
        timeout_ns, rank, cap, H, comb_offset, returned_word,
        WS=ws, BLOCK=block, PUSH=push, PULL=pull, TIMED=timed, num_warps=4,
    )
