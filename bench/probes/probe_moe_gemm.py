"""Probe of the MoE producer's grouped GEMMs on one GPU (explains bench_moe's numbers; not a test).

    python bench/probes/probe_moe_gemm.py [--ws 2] [--configs mixtral,deepseek,deepseek-decode] [--out FILE]

One rank's view of an expert-parallel MoE layer (bench_moe's configs and routing, ``--ws`` ranks
simulated, every source's rows already in the dispatch buffer, every flag raised: epoch 0, no
communication). Per block config of ``moe_gemm``'s kernels: ``gate_up_kernel`` and ``down_kernel``
alone (CUDA events, median of 20 after warm-up), launched once over all groups walking
from the own groups as the runtime does (``one``, ``SCHEDULE = "rotated"``), and once per source
position (``phased``, ``SCHEDULE = "phased"``); next to them the
baseline's expert compute (``index_select`` + three ``torch._grouped_mm`` + silu*up + scatter,
what bench_moe calls ``experts``) and its grouped GEMMs alone. Also the host time of one call's
plan and of each launch (what the CPU spends per layer), and the numerics of the
best config against the baseline (relative error, float32 reference not needed: both round once).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.suites.bench_moe import CONFIGS  # noqa: E402
from overlap_backend.tools.calibrate import timed_ms  # noqa: E402
from overlap_backend.codegen import moe_gemm  # noqa: E402
from overlap_backend.runtime import moe_symm  # noqa: E402
from overlap_backend.runtime.symm import lowering_helpers  # noqa: E402

GATE_UP = list(moe_gemm.GATE_UP_16BIT)  # (BM, BN, BK, GROUP_M, stages, warps, -): two [BM, BN] accumulators
DOWN = list(moe_gemm.DOWN_16BIT)


REPS = 20  # timed_ms: CUDA events, median of REPS calls after warm-up (the calibration's timer)


class Rank:
    """Rank 0 of ``ws``: the rows every source sends it, grouped by local expert (as bench_moe)."""

    def __init__(self, cfg: str, routing: str, ws: int, dev):
        h, f, experts, k, tokens = CONFIGS[cfg]
        self.h, self.f, self.e_local, self.ws = h, f, experts // ws, ws
        local_expert = []
        for src in range(ws):
            gen = torch.Generator().manual_seed(1234 + src)
            scores = torch.rand(tokens, experts, generator=gen)
            if routing == "skewed":
                scores[:, 0] += 10.0
            dest = scores.topk(k, dim=1).indices.view(-1).sort().values
            local_expert.append(dest[dest < self.e_local])  # rows for rank 0, sorted by expert
        self.recv = [len(v) for v in local_expert]
        e_recv = torch.cat(local_expert).to(dev)
        self.rows = torch.sort(e_recv, stable=True).indices
        sizes = torch.bincount(e_recv, minlength=self.e_local)
        self.offsets = torch.cumsum(sizes, 0).to(torch.int32)
        g = torch.Generator(device=dev).manual_seed(7)
        bf = torch.bfloat16
        self.r = torch.randn(sum(self.recv), h, device=dev, generator=g).to(bf)
        self.w_gate = (torch.randn(self.e_local, h, f, device=dev, generator=g) / math.sqrt(h)).to(bf)
        self.w_up = (torch.randn(self.e_local, h, f, device=dev, generator=g) / math.sqrt(h)).to(bf)
        self.w_down = (torch.randn(self.e_local, f, h, device=dev, generator=g) / math.sqrt(f)).to(bf)
        self.cap = max(self.recv)
        self.disp = torch.zeros(ws * self.cap, h, device=dev, dtype=bf)
        off = 0
        for s, n in enumerate(self.recv):
            self.disp[s * self.cap : s * self.cap + n] = self.r[off : off + n]
            off += n
        self.recv_off = torch.tensor([0] + torch.tensor(self.recv).cumsum(0).tolist(), dtype=torch.int32, device=dev)
        self.flags = torch.zeros(64, dtype=torch.int32, device=dev)  # epoch 0: every wait passes
        self.status = (torch.zeros(1, dtype=torch.int32, device=dev), torch.zeros(8, dtype=torch.int32, device=dev))
        m = self.rows.shape[0]
        self.act = torch.empty(m, f, device=dev, dtype=bf)
        self.out = torch.empty(1, h, device=dev, dtype=bf)  # rank 0's own rows: own_row0 = 0
        self.own = torch.empty(max(self.recv[0], 1), h, device=dev, dtype=bf)
        self.stage = torch.empty(sum(self.recv), h, device=dev, dtype=bf)
        self.flops = 2 * m * h * f * 3

    def baseline(self, gemms_only=False):
        xg = self.r.index_select(0, self.rows)
        g = torch._grouped_mm(xg, self.w_gate, offs=self.offsets)
        u = torch._grouped_mm(xg, self.w_up, offs=self.offsets)
        y = torch._grouped_mm(F.silu(g) * u, self.w_down, offs=self.offsets)
        if gemms_only:
            return y
        yr = torch.empty_like(self.r)
        yr[self.rows] = y
        return yr

    def plan(self, bms, expert_major, reference=False):
        fn = moe_symm.plan_reference if reference else moe_symm.plan
        return fn(self.rows, self.offsets, self.recv_off, 0, self.ws, self.e_local, bms, expert_major)

    def run(self, pl, cfg_a, cfg_b, grid, phases, part="both", start_group=None):
        for ph in phases:
            if part in ("both", "gate_up"):
                moe_gemm.launch_gate_up(self.disp, self.w_gate, self.w_up, self.act, pl, self.flags, self.flags, 0,
                                        self.status,
                                        10**10, 0, self.ws, self.cap, cfg_a, grid, timed=self.disp.is_cuda, phase=ph,
                                        start_group=start_group)
            if part in ("both", "down"):
                moe_gemm.launch_down(self.act, self.w_down, self.own, self.stage, pl, self.flags[16:],
                                     self.flags[32:], 0, 0, self.ws, 0, cfg_b, grid, phase=ph)


def probe(cfg: str, routing: str, ws: int, dev, grid: int) -> dict:
    p = Rank(cfg, routing, ws, dev)
    res = {"config": cfg, "routing": routing, "ws": ws, "rows": p.rows.shape[0], "recv": p.recv}
    res["baseline_ms"] = timed_ms(lambda: p.baseline(), REPS)
    res["grouped_mm_ms"] = timed_ms(lambda: p.baseline(gemms_only=True), REPS)
    em = moe_symm.expert_major(p.rows.shape[0], ws, p.e_local)
    res["expert_major"] = em
    bms = sorted({c[0] for c in GATE_UP + DOWN})
    pl = p.plan(bms, em)
    one = [(0, ws * p.e_local, 0, ws)]
    phased = moe_gemm.phases(ws, p.e_local, em)
    own = None if em else (ws - 1) * p.e_local  # the runtime's default schedule: own groups first
    res["gate_up"], res["down"] = {}, {}
    for name, cands, part in (("gate_up", GATE_UP, "gate_up"), ("down", DOWN, "down")):
        for c in cands:
            try:
                t1 = timed_ms(lambda: p.run(pl, c, c, grid, one, part, own), REPS)
                tp = timed_ms(lambda: p.run(pl, c, c, grid, phased, part), REPS)
                res[name][str(c)] = {"one": t1, "phased": tp}
            except Exception as e:  # noqa: BLE001 - e.g. out of shared memory
                res[name][str(c)] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    best = {}
    for name in ("gate_up", "down"):
        ok = {k: v for k, v in res[name].items() if "one" in v}
        best[name] = min(ok, key=lambda k: ok[k]["one"]) if ok else None
    res["best"] = best
    if all(best.values()):
        ca = next(c for c in GATE_UP if str(c) == best["gate_up"])
        cb = next(c for c in DOWN if str(c) == best["down"])
        res["ours_best_phased_ms"] = timed_ms(lambda: p.run(pl, ca, cb, grid, phased), REPS)
        res["ours_best_ms"] = timed_ms(lambda: p.run(pl, ca, cb, grid, one, start_group=own), REPS)
        # numerics: the baseline's rows vs ours (own rows in `own`, remote in `stage`)
        ref = p.baseline().float()
        p.own.fill_(float("nan"))
        p.stage.fill_(float("nan"))
        p.run(pl, ca, cb, grid, one, start_group=own)
        torch.cuda.synchronize()
        got = p.stage.float()
        got[: p.recv[0]] = p.own[: p.recv[0]].float()
        res["rel_err"] = ((got - ref).norm() / ref.norm()).item()
        # host time of plan + launches, no synchronisation (median of 20)
        host = {"plan": [], "gate_up": [], "down": []}
        for _ in range(25):
            t0 = time.perf_counter()
            pl2 = p.plan(sorted({ca[0], cb[0]}), em)
            t1 = time.perf_counter()
            p.run(pl2, ca, cb, grid, one, "gate_up", own)
            t2 = time.perf_counter()
            p.run(pl2, ca, cb, grid, one, "down")
            t3 = time.perf_counter()
            for k, dt in (("plan", t1 - t0), ("gate_up", t2 - t1), ("down", t3 - t2)):
                host[k].append(dt * 1e3)
            torch.cuda.synchronize()  # host times of one call, not of a queue that is full
        res["host_ms"] = {k: statistics.median(v[5:]) for k, v in host.items()}
        # the plan: torch ops (plan_reference) vs the plan kernel where it applies; host and GPU time
        bms2 = sorted({ca[0], cb[0]})
        for name, ref in (("plan_torch", True), ("plan_kernel", False)):
            hs = []
            for _ in range(25):
                t0 = time.perf_counter()
                p.plan(bms2, em, reference=ref)
                hs.append((time.perf_counter() - t0) * 1e3)
                torch.cuda.synchronize()
            res["host_ms"][name] = statistics.median(hs[5:])
            res[f"{name}_gpu_ms"] = timed_ms(lambda ref=ref: p.plan(bms2, em, reference=ref), REPS)
        from overlap_backend.codegen import moe_plan

        res["plan_kernel_applies"] = moe_plan.unsupported(p.rows.shape[0], ws * p.e_local, bms2) is None
        res["tflops_ours"] = p.flops / res["ours_best_ms"] / 1e9
    res["tflops_grouped_mm"] = p.flops / res["grouped_mm_ms"] / 1e9
    return res


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--ws", type=int, default=2)
    ap.add_argument("--configs", default="mixtral,deepseek,deepseek-decode")
    ap.add_argument("--routing", default="balanced")
    ap.add_argument("--comm-sms", type=int, default=8, help="SMs left to the comm kernel (grid = SMs - this)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    lowering_helpers.load_kernels()  # Triton's allocator for device-side descriptors
    grid = torch.cuda.get_device_properties(dev).multi_processor_count - a.comm_sms
    results = []
    for cfg in a.configs.split(","):
        for routing in a.routing.split(","):
            r = probe(cfg, routing, a.ws, dev, grid)
            results.append(r)
            print(f"== {cfg} {routing} ws{a.ws}: rows {r['rows']} expert_major {r['expert_major']} "
                  f"baseline {r['baseline_ms']:.3f} grouped_mm {r['grouped_mm_ms']:.3f} ms "
                  f"({r['tflops_grouped_mm']:.0f} TFLOP/s)")
            for name in ("gate_up", "down"):
                for c, v in r[name].items():
                    print(f"   {name:8s} {c}: " + (v.get("error") or f"one {v['one']:.3f} phased {v['phased']:.3f}"))
            if "ours_best_phased_ms" in r:
                host = ", ".join(f"{k} {v:.3f}" for k, v in r["host_ms"].items())
                print(f"   best {r['best']}: one launch each {r['ours_best_ms']:.3f} ms ({r['tflops_ours']:.0f} "
                      f"TFLOP/s), phased {r['ours_best_phased_ms']:.3f} ms, rel err {r['rel_err']:.2e}, "
                      f"host ms/call: {host}; plan GPU ms: torch {r['plan_torch_gpu_ms']:.3f}, kernel "
                      f"{r['plan_kernel_gpu_ms']:.3f} (applies: {r['plan_kernel_applies']})")
            sys.stdout.flush()
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
