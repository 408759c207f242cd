"""Probe: one case of the kernel benchmark in one config, checked, then called a few times: the program a profiler
(``ncu``) wraps to read one kernel's counters (a diagnostic, not a benchmark: its times are CUDA events of a few
calls, beside the baseline's).

    python bench/probes/run_case.py KERNEL WS MxKxN [--epilogue gelu] [--moe deepseek] [--config "(128,128,64,8,4,4,'ws_pingpong')"]
        [--calls 5] [--baseline]

``KERNEL WS MxKxN``: a ``bench/suites/kernel_cases.Case`` (``bench/results/.../table.md`` names them: local M × K × N
as rank 0 of WS); ``--config``: a config tuple (default: the op's first candidate, or what the set-up derives).
Poisons the outputs and checks the result against float32 first (exits 1 past 1e-2), then makes ``--calls`` calls of
the kernel, each synchronized (``--baseline``: each followed by one baseline call), and prints the kernel's and the
baseline's median ms. The calls run in an NVTX range ``run_case``: under ncu, keep to it, pick the kernel by name and
skip its first call:

    ncu --clock-control none --nvtx --nvtx-include run_case/ -k regex:ag_mm_ws --launch-skip 1 --launch-count 1 \\
        python bench/probes/run_case.py ag_mm 4 8192x4096x3584 --epilogue gelu --config "(...,'ws_pingpong')"
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from bench.suites.kernel_cases import Case  # noqa: E402
from bench.suites.kernel_setups import Bench  # noqa: E402
from bench.tools import common  # noqa: E402


def parse_case(kernel: str, ws: int, shape: str, epilogue: str = "", moe: str = "") -> Case:
    """The benchmark's case for ``KERNEL WS MxKxN``."""
    try:
        M, K, N = (int(x) for x in shape.lower().split("x"))
    except ValueError:
        raise SystemExit(f"shape {shape!r} is not MxKxN") from None
    return Case(kernel, ws, M, K, N, epilogue, moe)


def run(case: Case, config, calls: int, baseline: bool, dev, dtype=torch.bfloat16, num_sms: int | None = None):
    """(relative error of the checked call, the config run, the kernel's call times in ms, the baseline's)."""
    if num_sms is None:
        num_sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 4
    b = Bench(case, dev, num_sms, 1, dtype)
    cfg = b.op_cands[0] if config is None else tuple(config)
    err = b.check(cfg)
    kernel_ms, base_ms = [], []
    # the calls in an NVTX range (``ncu --nvtx --nvtx-include run_case/``): not the set-up's reference GEMMs
    with torch.cuda.nvtx.range("run_case") if dev.type == "cuda" else contextlib.nullcontext():
        for _ in range(calls):
            kernel_ms.append(_timed(lambda: b.run(cfg), dev))
            if baseline:
                base_ms.append(_timed(b.baseline[1], dev))
    return err, cfg, kernel_ms, base_ms


def _timed(fn, dev) -> float:
    """One call's CUDA-event time in ms (on the CPU: wall time), synchronized."""
    if dev.type != "cuda":
        import time

        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    common.synchronize(dev)
    return start.elapsed_time(end)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("kernel")
    p.add_argument("ws", type=int)
    p.add_argument("shape", help="local M x K x N, e.g. 8192x4096x3584")
    p.add_argument("--epilogue", default="")
    p.add_argument("--moe", default="")
    p.add_argument("--config", default=None, help="a config tuple (Python literal)")
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--baseline", action="store_true", help="a baseline call after each kernel call")
    args = p.parse_args(argv)
    case = parse_case(args.kernel, args.ws, args.shape, args.epilogue, args.moe)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # (the CPU: Triton's interpreter)
    import triton

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))
    config = ast.literal_eval(args.config) if args.config else None
    err, cfg, kernel_ms, base_ms = run(case, config, args.calls, args.baseline, dev,
                                       torch.bfloat16 if dev.type == "cuda" else torch.float32)
    line = f"{case.label()} config {cfg}: rel err {err:.2e}; kernel {statistics.median(kernel_ms):.4f} ms"
    if base_ms:
        line += f", baseline {statistics.median(base_ms):.4f} ms"
    print(line, flush=True)
    return 0 if err <= 1e-2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
