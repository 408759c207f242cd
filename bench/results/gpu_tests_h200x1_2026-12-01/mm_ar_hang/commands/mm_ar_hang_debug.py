"""Why does mm_ar in rounds (M=2048, K=3584 per rank, N=8192, bf16: calibrate.HOST_PROBES["mm_ar"]) never raise one
rank's DONE flag of its own round-1 chunk (session 21 call 1, two ranks sharing one H200)?

    OVERLAP_TEST_SHARED_GPU=1 python bench/results/2026-12-01_h200x1_session21/commands/mm_ar_hang_debug.py VARIANT...

Each VARIANT runs in a fresh pair of processes: ``M,K,N[,transport[,forced[,reserve]]]`` (forced: a FORCED block config
on both ranks instead of each rank's tuning; reserve: SMs the kernels' grids leave free). Per call, every rank waits up to HANG_S for
its compute stream; when it is stuck it reads its own flag words through a stream of its own (as the watchdog
does, before the watchdog's release at 1.25 x OVERLAP_TIMEOUT_S) and prints the words of the mm_ar protocol
that are set: READY, RS_ARRIVED, GATHERED, DONE, COUNTERS, CLAIM, TICKET, and the kernel's report. It also
prints the block config each rank tuned.
"""
import ctypes
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "tests"))
HANG_S = 12


def read_flags(st):
    from overlap_backend.runtime import cuda as _cuda, symm

    n = symm.FLAG_WORDS
    host = _cuda.host_alloc_mapped(4 * n)
    words = (ctypes.c_int32 * n).from_address(host)
    stream = _cuda.stream_create_nonblocking()
    _cuda.copy_async(host, st.flags.local, 4 * n, stream)
    _cuda.stream_synchronize(stream)
    out = {}
    for name, lo, count in (("READY", symm.READY, st.ws), ("RS_ARRIVED", symm.RS_ARRIVED, 16),
                            ("GATHERED", symm.GATHERED, 16), ("DONE", symm.DONE, 16),
                            ("COUNTERS", symm.COUNTERS, 16), ("CLAIM", symm.CLAIM, 1), ("TICKET", symm.TICKET, 1)):
        out[name] = [words[lo + i] for i in range(count)]
    out["status"] = list(st.status)[:8]
    return out


def say(rank, line):
    print(f"rank {rank}: {line}", flush=True)


FORCED = {"bn256": (128, 256, 64, 8, 3, 8, False), "bn128": (128, 128, 64, 8, 4, 4, False)}


def worker(rank, ws, m, k, n, transport, forced="", reserve=0):
    import torch
    import torch.distributed as dist

    from overlap_backend.runtime import symm, symm_lowering

    if transport:
        symm_lowering.TRANSPORT = transport
    if reserve:  # the kernels' grids leave this many SMs free (GroupState.num_sms bounds every grid)
        init = symm.GroupState.__init__

        def reserving(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self.num_sms -= reserve

        symm.GroupState.__init__ = reserving
    if forced:  # both ranks use this block config (no tuning)
        symm_lowering._picked[("mm_ar", (m, n, k, "torch.bfloat16", False))] = FORCED[forced]
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device="cpu").manual_seed(rank)
    a = torch.randn(m, k, generator=gen).to(dev, torch.bfloat16)
    b = torch.randn(k, n, generator=gen).to(dev, torch.bfloat16)
    gn = dist.group.WORLD.group_name
    for call in range(6):
        t0 = time.perf_counter()
        y = torch.ops.overlap.mm_ar(a, b, None, "sum", gn, "symm")
        ev = torch.cuda.Event()
        ev.record()
        while not ev.query() and time.perf_counter() - t0 < HANG_S:
            time.sleep(0.01)
        st = symm.state(gn, dev)
        picked = {k_: v for k_, v in symm_lowering._picked.items() if k_[0] == "mm_ar"}
        if not ev.query():
            say(rank, f"call {call} (epoch {st.epoch}) STUCK after {HANG_S} s; tuned {picked}")
            try:
                say(rank, f"flags {read_flags(st)}")
            except Exception as e:  # noqa: BLE001 - a dead context says so here
                say(rank, f"flags unreadable: {type(e).__name__}: {e}")
            os._exit(3)  # (a stuck stream would hold the harness's teardown until the watchdog fires)
        ref = a.float() @ b.float()
        dist.all_reduce(ref)  # gloo's all_reduce takes CUDA tensors (the shared mode's group is gloo)
        err = ((y.float() - ref).norm() / ref.norm()).item()
        say(rank, f"call {call} (epoch {st.epoch}) ok in {time.perf_counter() - t0:.2f} s, rel err {err:.2e}; "
                   f"tuned {picked}; paths {dict(symm_lowering.PATHS)}")
    return "ok"


def worker_safe(rank, ws, m, k, n, transport, forced, reserve):
    try:
        return worker(rank, ws, m, k, n, transport, forced, reserve)
    except Exception as e:  # noqa: BLE001 - the report is the point
        say(rank, f"{type(e).__name__}: {str(e)[:600]}")
        return "failed"


if __name__ == "__main__":
    from dist_harness import run_ranks

    os.environ.setdefault("OVERLAP_TIMEOUT_S", "60")
    for variant in sys.argv[1:]:
        print("=== variant", variant, flush=True)
        parts = variant.split(",")
        m, k, n = (int(x) for x in parts[:3])
        transport = parts[3] if len(parts) > 3 else ""
        forced = parts[4] if len(parts) > 4 else ""
        reserve = int(parts[5]) if len(parts) > 5 else 0
        try:
            print(variant, run_ranks(worker_safe, 2, m, k, n, transport, forced, reserve, timeout=60, backend="nccl"), flush=True)
        except AssertionError as e:
            print(variant, "FAILED:", [ln for ln in str(e).splitlines() if "Error" in ln or "rank" in ln][-6:], flush=True)
