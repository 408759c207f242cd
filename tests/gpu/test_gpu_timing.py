"""GPU test (marker ``gpu``) of the kernel benchmark's timing (``bench/tools/common.py``): ``queued_ms`` times the
GPU alone, where back-to-back event timing (``events_ms``) reads the host's launch time of a call whose launch
takes longer than its kernel; ``paired_queued_ms`` gives a call's ratio to the baseline calls beside it.

Run on the device machine: ``python -m pytest -q -m gpu tests/gpu/test_gpu_timing.py``.
"""

from __future__ import annotations

import time

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_queued_timing_leaves_the_launch_time_out():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from bench.tools import common

    x = torch.randn(256, 256, device="cuda")

    def slow_launch():  # a kernel of microseconds behind 2 ms of host work
        deadline = time.perf_counter() + 2e-3
        while time.perf_counter() < deadline:
            pass
        return x.mul_(1.0)

    gpu_only = common.events_ms(lambda: x.mul_(1.0), n=20)
    back_to_back = common.events_ms(slow_launch, n=20)
    queued = common.queued_ms(slow_launch, n=20)
    print(f"kernel alone {gpu_only:.4f} ms; slow launch back to back {back_to_back:.4f} ms, queued {queued}")
    assert back_to_back >= 1.9  # the host's 2 ms show in event timing
    assert queued.queued and queued.host_us >= 1900
    assert queued.ms < 0.2 and queued.ms < 5 * gpu_only + 0.02  # and not in the queued GPU time


def test_paired_timing_divides_each_call_by_the_baseline_beside_it():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from bench.tools import common

    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)

    def one():
        return torch.mm(x, x, out=y)

    def two():
        torch.mm(x, x, out=y)
        return torch.mm(x, x, out=y)

    same = common.paired_queued_ms(one, one, n=20)
    double = common.paired_queued_ms(two, one, n=20)
    print(f"paired: the same GEMM {same}; two GEMMs against one {double}")
    assert same.queued and double.queued
    assert 0.95 < same.ratio < 1.05 and same.ms > 0 and same.baseline_ms > 0
    assert 1.85 < double.ratio < 2.15 and double.ms > 1.5 * double.baseline_ms
