"""Which calibrate.HOST_PROBES call faulted with an illegal memory access in call 8 (two ranks sharing one H200)?

    OVERLAP_TEST_SHARED_GPU=1 python bench/results/2026-12-01_h200x2_session20/commands/host_probe_debug.py [MODE]

MODE ``alone`` (default): each probe in its own pair of processes, 33 calls, synchronising after every call (the
first failing call is named). ``sequence``: all probes in one pair of processes in measure_host's order, 3 calls then
30 back to back per probe, synchronising after each batch (call 8's pattern, localised to a probe and a batch).
Do not set CUDA_LAUNCH_BLOCKING: blocking launches deadlock the kernels that spin on flags another stream raises
(call 9's mm_rs / mm_ar-rounds timeouts). Without OVERLAP_TEST_SHARED_GPU it needs two GPUs.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "tests"))


def probe_calls(rank, ws, device, keys, batches):
    """Run each probe's batches (call counts), synchronising after each; return where it failed, if it did."""
    import torch
    import torch.distributed as dist

    from overlap_backend import calibrate

    dev = torch.device("cuda", torch.cuda.current_device())
    done = []
    for key in keys:
        op, m, k, n = calibrate.HOST_PROBES[key]
        call = calibrate._host_probe(op, m, k, n, dist.group.WORLD, "symm", dev, torch.bfloat16)
        for b, count in enumerate(batches):
            try:
                for _ in range(count):
                    call()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - the report is the point
                return f"{key} batch {b} ({count} calls) after {done}: {type(e).__name__}: {str(e).splitlines()[0]}"
            done.append(f"{key}#{b}")
    return f"ok: {done}"


if __name__ == "__main__":
    from dist_harness import run_ranks

    from overlap_backend import calibrate

    mode = sys.argv[1] if len(sys.argv) > 1 else "alone"
    plans = ([([key], [1] * 33) for key in calibrate.HOST_PROBES] if mode == "alone"
             else [(list(calibrate.HOST_PROBES), [3, 30, 30, 30])])
    for keys, batches in plans:
        try:
            print(keys, run_ranks(probe_calls, 2, "cuda", keys, batches, timeout=120, backend="nccl"), flush=True)
        except AssertionError as e:
            print(keys, "FAILED:", [ln for ln in str(e).splitlines() if "Error" in ln][-3:], flush=True)
