"""Which calibrate.HOST_PROBES op crashed with an illegal memory access in call 8 (two ranks sharing one H200)?
Each probe alone, in its own pair of processes, synchronising after every call.

    OVERLAP_TEST_SHARED_GPU=1 CUDA_LAUNCH_BLOCKING=1 python bench/results/2026-12-01_h200x2_session20/commands/host_probe_debug.py
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "tests"))


def one_probe(rank, ws, device, key):
    import torch
    import torch.distributed as dist

    from overlap_backend import calibrate
    from overlap_backend.runtime import symm_lowering

    op, m, k, n = calibrate.HOST_PROBES[key]
    dev = torch.device("cuda", torch.cuda.current_device())
    call = calibrate._host_probe(op, m, k, n, dist.group.WORLD, "symm", dev, torch.bfloat16)
    for i in range(4):
        call()
        torch.cuda.synchronize()
    return {k: v for k, v in symm_lowering.PATHS.items() if v}


if __name__ == "__main__":
    from dist_harness import run_ranks

    from overlap_backend import calibrate

    for key in calibrate.HOST_PROBES:
        try:
            out = run_ranks(one_probe, 2, "cuda", key, timeout=60, backend="nccl")
            print(f"{key}: ok {out[0]}", flush=True)
        except AssertionError as e:
            lines = [ln for ln in str(e).splitlines() if "Error" in ln or "line" in ln]
            print(f"{key}: FAILED\n  " + "\n  ".join(lines[-12:]), flush=True)
