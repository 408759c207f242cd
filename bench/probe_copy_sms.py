"""Does a copy need SMs? One GPU, one process (explains the twenty-first session's shared-GPU hang; not a test).

    python bench/probe_copy_sms.py [--mib 64] [--timeout-s 2]

A spinning kernel fills every SM's thread slots (2 CTAs of 1024 threads per SM, or leaves ``--free`` SMs
without them) and waits, bounded, for a flag. Another stream then queues a copy (``cuMemcpyAsync``, the call
the ``symm`` runtime pushes with) and behind it ``cuStreamWriteValue32`` of the flag. If the copy runs on a copy
engine, the flag rises while the kernel spins and the kernel ends at once; if the driver runs it as a kernel on
the SMs, it cannot start, the spinners give up after ``--timeout-s`` and the flag comes too late. Per copy kind:
device to device (same device, same process), device to pinned host, pinned host to device, and no copy (the
stream write alone), and device to device by ``cuMemcpyBatchAsync`` with the hint that the copy should overlap
compute (``d2d_prefer_ce``). Prints one JSON line per case: whether the spinners saw the flag, how long they ran, and
how far apart their starts were (all resident: the SMs' thread slots were full).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from overlap_backend.codegen.flags import _now_ns  # noqa: E402
from overlap_backend.runtime import cuda as _cuda  # noqa: E402


@triton.jit
def spin_kernel(flag_ptr, seen_ptr, start_ptr, timeout_ns):
    """Every CTA: spin until ``*flag_ptr != 0`` or ``timeout_ns`` passed; store what it saw and when it started."""
    start = _now_ns(True)
    seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
    waiting = seen == 0
    while waiting:
        seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
        waiting = (seen == 0) & (_now_ns(True) - start < timeout_ns)
    tl.store(seen_ptr + tl.program_id(0), seen)
    tl.store(start_ptr + tl.program_id(0), start)


def memcpy_prefer_ce(dst: int, src: int, nbytes: int, stream, hints: bool) -> None:
    """``cuMemcpyBatchAsync`` of one copy with ``CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE`` (a hint
    that the copy should run beside compute work, i.e. on a copy engine; CUDA 12.8+), in stream order.
    ``hints``: also name the device as the source's and destination's location."""
    from cuda.bindings import driver

    attrs = driver.CUmemcpyAttributes()
    attrs.srcAccessOrder = driver.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
    attrs.flags = driver.CUmemcpyFlags.CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE
    if hints:
        for loc in (attrs.srcLocHint, attrs.dstLocHint):
            loc.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            loc.id = torch.cuda.current_device()
    out = driver.cuMemcpyBatchAsync([driver.CUdeviceptr(dst)], [driver.CUdeviceptr(src)], [nbytes], 1, [attrs], [0], 1,
                                    driver.CUstream(stream.cuda_stream))
    rc = out[0] if isinstance(out, tuple) else out
    if rc != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuMemcpyBatchAsync: {out}")


def case(kind: str, nbytes: int, timeout_s: float, free_sms: int) -> dict:
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    grid = 2 * (sms - free_sms)
    flag = torch.zeros(1, dtype=torch.int32, device=dev)
    seen = torch.full((grid,), -1, dtype=torch.int32, device=dev)
    starts = torch.zeros(grid, dtype=torch.int64, device=dev)
    on_dev = kind.startswith("d2d") or kind == "d2h"
    src = torch.randn(nbytes // 4, device=dev) if on_dev else torch.randn(nbytes // 4).pin_memory()
    dst = (torch.empty_like(src, device=dev) if kind.startswith("d2d") or kind == "h2d"
           else torch.empty(nbytes // 4, pin_memory=True))
    spinner, other = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.cuda.stream(spinner):
        spin_kernel[(grid,)](flag, seen, starts, int(timeout_s * 1e9), num_warps=32)
        done = torch.cuda.Event()
        done.record()
    time.sleep(0.05)  # the spinners are resident before the copy is queued
    if kind.startswith("d2d_prefer_ce"):
        memcpy_prefer_ce(dst.data_ptr(), src.data_ptr(), nbytes, other, hints=kind.endswith("hints"))
    elif kind != "none":
        _cuda.memcpy_async(dst.data_ptr(), src.data_ptr(), nbytes, other)
    _cuda.write_value32(flag.data_ptr(), 1, other)
    done.synchronize()
    took = time.perf_counter() - t0
    torch.cuda.synchronize()
    copied = kind == "none" or torch.equal(dst.cpu(), src.cpu())
    seen_host, starts_host = seen.cpu(), starts.cpu()
    return dict(kind=kind, mib=nbytes >> 20, free_sms=free_sms, ctas=grid, spinners_saw_flag=int((seen_host == 1).sum()),
                spun_s=round(took, 3), start_spread_ms=round((starts_host.max() - starts_host.min()).item() / 1e6, 3),
                copied=copied)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--timeout-s", type=float, default=2.0)
    p.add_argument("--free", default="0,4", help="SMs the spinners leave without CTAs, comma-separated")
    p.add_argument("--kinds", default="none,d2d,d2h,h2d,d2d_prefer_ce,d2d_prefer_ce_hints",
                   help="d2d_prefer_ce[_hints]: device to device by cuMemcpyBatchAsync, preferring overlap with compute")
    args = p.parse_args()
    print(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)))
    for free in (int(f) for f in args.free.split(",")):
        for kind in args.kinds.split(","):
            try:
                print(json.dumps(case(kind, args.mib << 20, args.timeout_s, free)), flush=True)
            except Exception as e:  # noqa: BLE001 - a refused API is a result too
                print(json.dumps(dict(kind=kind, free_sms=free, error=f"{type(e).__name__}: {e}")), flush=True)
                torch.cuda.synchronize()


if __name__ == "__main__":
    main()
