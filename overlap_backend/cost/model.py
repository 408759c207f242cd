"""The cost model: per match, predicted time of the plain graph vs the rewritten op.

A small explicit analytic model (formulas, constants and the fit: ``docs/cost_model.md``). Inputs
per match (:class:`Problem`): the op, its GEMM sizes (hints of symbolic sizes), the dtype, the group
size and the machine's :class:`~overlap_backend.cost.calibration.Calibration`. Outputs
(:class:`Prediction`): the plain sequence's time (``baseline``: GEMM then collective, or the
reverse), each candidate lowering's time with its knobs chosen (chunk count, communication SMs) by
minimising the prediction, and whether the best one wins by more than ``knobs.cost.MARGIN``.

Building blocks, times in ms (``e`` bytes per element, ``ws`` the group size; the constants are the
``cost`` knobs, ``overlap_backend/spec/knobs/cost.py``):

- ``gemm(m, n, k) = launch + max(2mnk / rate(dtype), (mk + kn + mn) e / hbm)``: roofline of cuBLAS;
  our persistent Triton GEMM (``symm``) takes ``TRITON_EFF`` times that.
- ``coll(kind, bytes) = latency + bus_bytes / busbw(ws)``, NCCL's bus bytes: ``bytes (ws-1)/ws`` for
  all-gather / reduce-scatter / all-to-all, twice that for all-reduce.
- the plain graph: ``SEQ_FACTOR x (gemm + coll)`` (back to back they take 7% less than apart).
- ``p2p`` ops are rings of ``ws`` steps: a step costs ``max(host step, chunk GEMM, chunk transfer)``
  (a step is host-bound on small shapes: Python, a side stream, events), the chunk GEMMs run
  ``P2P_GEMM_SLOWDOWN`` slower next to NCCL's send/recv kernels.
- ``symm`` ops run ``max(host time per call, device time)``: back-to-back calls are host-bound below
  the host time (0.2-0.5 ms per call measured); the device time is the GEMM overlapped with the
  copy-engine transfers, plus what cannot overlap (the first or last chunk, the combine).

The chunking the runtime does (bands, all-reduce rounds, the one-shot limit, the CTA pipeline's
K-chunks and blocks) is read from the runtime's own functions and knobs at each prediction, so a
changed tunable changes the op and its price together.

Under CUDA graphs (``mode="reduce-overhead"``, :attr:`PassContext.cuda_graphs`) the ops that can be
captured (:data:`GRAPH_OPS`) cost their device time only: a replay launches the whole graph at
once, so no host time per call or per ring step is paid; ``symm`` stays a candidate only where its
calls are captured on ``symm`` (``knobs.symm.CAPTURE_ON_SYMM``; else they run on p2p).

Pure arithmetic on its inputs: every rank that gives it the same problem and calibration
(``cost/decision.py`` makes the ranks agree on one) gets the same prediction. Nothing is measured
while compiling.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..spec import kernel_ratios, knobs, symm_layout
from .calibration import Calibration

OPS = ("ag_mm", "mm_rs", "mm_ar", "moe_experts", "cta_pipeline_mlp")
ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}
# ops whose calls a CUDA graph captures (on symm: with the toggling flag block; cta_pipeline_mlp with
# device-counted epochs and peer stores)
GRAPH_OPS = ("ag_mm", "mm_rs", "mm_ar", "moe_experts", "cta_pipeline_mlp")
# ...but the p2p paths of these keep their host time: dropless moe_experts reads counts on the host,
# and neither was measured captured. Captured symm measured on 2xH200 (bench_moe --graphs):
# DeepSeek-like 6.10 ms vs the captured baseline's 7.26 (predicted 6.08 vs 7.11), Mixtral-like decode
# 0.81 vs 0.56 (predicted 0.69 vs 0.49: kept plain); cta_pipeline_mlp (bench_cta --graphs, 2xH200,
# H 8192, F 28672): TP2 faster at every M, as predicted (M >= 512 within 17 %; M=128 0.22 vs 0.45).
GRAPH_P2P_HOST_KEPT = ("moe_experts", "cta_pipeline_mlp")
# Eager calls of these ops replay private CUDA graphs (knobs.symm.PRIVATE_GRAPHS): measured on one H200 at
# 0.48-0.76x the host time of the plain graph compiled by Inductor with NCCL (bench/results/host_h200x1_2026-12-02/
# private_graphs; moe_experts 0.59x, cta_pipeline_mlp 0.57x at M = 512, host_h200x1_2026-12-05), so like a
# replay their symm plan carries no host floor. moe_experts only with fixed splits: a graph serves calls that
# send what it was captured with.
PRIVATE_GRAPH_OPS = ("ag_mm", "mm_rs", "mm_ar", "cta_pipeline_mlp", "moe_experts")


@dataclass(frozen=True)
class Problem:
    """One match, as the model sees it (sizes are ints: hints of symbolic sizes).

    ``ag_mm``: ``m`` gathered rows, ``k`` the contraction, ``n`` the sum of its matmuls' columns,
    ``gemms`` how many. ``mm_rs`` / ``mm_ar``: ``[m, k] @ [k, n]`` per rank (``k`` the local shard).
    ``cta_pipeline_mlp``: ``x [m, k]``, ``w1 [k, f]`` per rank, ``w2 [f, n]``, ``activation``.
    ``moe_experts``: ``m`` grouped rows, ``rows_sent`` rows of ``x``, ``k`` hidden, ``f`` expert
    width, ``experts`` per rank, ``fixed_splits`` whether the all-to-alls' split sizes are constants of the
    graph (capacity routing: every call sends the same, so its eager calls replay a private graph).
    """

    op: str
    m: int
    n: int
    k: int
    dtype: str
    ws: int
    gemms: int = 1
    f: int = 0
    experts: int = 0
    rows_sent: int = 0
    fixed_splits: bool = False
    activation: str = ""
    # ``ag_mm`` with a prologue (passes/prologue.py): bytes its row-wise ops move over the gathered
    # rows in the plain graph (the rewrite moves 1/ws of them, on the shard), and the bytes and
    # kernels of the weight / bias folds the rewrite adds per call
    prologue_bytes: int = 0
    fold_bytes: int = 0
    folds: int = 0

    def __post_init__(self):
        if self.op not in OPS:
            raise ValueError(f"unknown op {self.op!r}")

    @property
    def e(self) -> int:
        return ELEMENT_BYTES.get(self.dtype, 4)

    def to_json(self) -> dict[str, Any]:
        d = {"op": self.op, "m": self.m, "n": self.n, "k": self.k, "dtype": self.dtype, "ws": self.ws}
        for name in ("gemms", "f", "experts", "rows_sent", "fixed_splits", "activation", "prologue_bytes", "fold_bytes",
                     "folds"):
            v = getattr(self, name)
            if v and not (name == "gemms" and v == 1):
                d[name] = v
        return d


@dataclass
class Plan:
    """One way to run the op: a lowering with its knobs, and the predicted time."""

    lowering: str
    ms: float
    chunks: int
    comm_sms: int | None = None
    stages: int | None = None
    terms: dict[str, float] = field(default_factory=dict)


@dataclass
class Prediction:
    problem: Problem
    baseline_ms: float
    baseline_terms: dict[str, float]
    plans: list[Plan]
    calibration: Calibration
    cuda_graphs: bool = False  # predicted for CUDA-graph replays (no host time per call)

    @property
    def best(self) -> Plan:
        return min(self.plans, key=lambda p: p.ms)  # ties: the first (preference order)

    @property
    def wins(self) -> bool:
        return self.best.ms < (1.0 - knobs.cost.MARGIN) * self.baseline_ms

    def reason(self) -> str:
        b = self.best
        return (f"cost model: predicted {_fmt(b.ms)} ms overlapped ({b.lowering}) vs {_fmt(self.baseline_ms)} ms plain"
                f" (needs < {1 - knobs.cost.MARGIN:.2f}x)")

    def to_json(self, mode: str, active: bool, plan: Plan | None = None) -> dict[str, Any]:
        """The ``cost`` entry of the match's summary record; ``plan``: the plan written (default:
        the best one; when the model is not active, the lowering the pass chose without it)."""
        b = plan or self.best
        return {
            "mode": mode,
            "active": active,
            "decision": ("rewrite" if self.wins else "keep plain") if active else "not used (rewrite)",
            "baseline_ms": _round(self.baseline_ms),
            "overlapped_ms": _round(b.ms),
            "lowering": b.lowering,
            "chunks": b.chunks,
            "comm_sms": b.comm_sms,
            "stages": b.stages,
            "candidates": {p.lowering: _round(p.ms) for p in self.plans},
            "terms": {"baseline": {k: _round(v) for k, v in self.baseline_terms.items()},
                      "overlapped": {k: _round(v) for k, v in b.terms.items()}},
            "problem": self.problem.to_json(),
            "calibration": {"key": self.calibration.key, "source": self.calibration.source},
            **({"cuda_graphs": True} if self.cuda_graphs else {}),
        }


def _fmt(ms: float) -> str:
    return f"{ms:.3g}" if ms < 10 else f"{ms:.1f}"


def _round(ms: float) -> float:
    return float(f"{ms:.4g}")


# ------------------------------------------------------------------------------ building blocks
def gemm_ms(cal: Calibration, m: float, n: float, k: float, dtype: str, eff: float = 1.0,
            compute_eff: float = 1.0) -> float:
    """One matmul ``[m, k] @ [k, n]``: launch + roofline (compute- or memory-bound); ``eff`` scales
    both, ``compute_eff`` only the compute-bound side."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    e = ELEMENT_BYTES.get(dtype, 4)
    flops = 2.0 * m * n * k
    nbytes = (m * k + k * n + m * n) * e
    return cal.launch_ms + max(flops / (cal.rate(dtype) * 1e9) * compute_eff, nbytes / (cal.hbm_gbps * 1e6)) * eff


def mem_ms(cal: Calibration, nbytes: float) -> float:
    return nbytes / (cal.hbm_gbps * 1e6)


def coll_ms(cal: Calibration, kind: str, nbytes: float, ws: int) -> float:
    """An NCCL collective on ``nbytes`` (the gathered output, the scattered input, the all-reduced
    tensor, or one rank's all-to-all send buffer)."""
    if kind == "all_reduce":  # a reduce-scatter and an all-gather: twice the bus bytes
        return cal.coll_latency_ms + 2 * nbytes * (ws - 1) / ws / (cal.busbw(ws) * knobs.cost.AR_BUSBW_GAIN * 1e6)
    return cal.coll_latency_ms + nbytes * (ws - 1) / ws / (cal.busbw(ws) * 1e6)


def p2p_ms(cal: Calibration, nbytes: float, ws: int) -> float:
    """One ring shift of ``nbytes`` (batch_isend_irecv, every rank sends and receives)."""
    return cal.p2p_latency_ms + nbytes / (cal.p2p_bw(ws) * 1e6)


def ce_ms(cal: Calibration, nbytes: float) -> float:
    """Copy-engine transfer of ``nbytes`` into (or out of) one rank."""
    return nbytes / (cal.ce_gbps * 1e6)


def bands(rows: int) -> int:
    """How many bands the symm runtime cuts a chunk of ``rows`` rows into (``spec.symm_layout.bands``)."""
    return len(symm_layout.bands(rows))


def ar_rounds(m: int, ws: int) -> int:
    """The row blocks of a symm ``mm_ar`` of ``m`` rows (``runtime.symm.mm_ar.ar_rounds``)."""
    from ..runtime.symm import mm_ar

    return mm_ar.ar_rounds(m, ws)


def _p2p_time(cal: Calibration, ws: int, device_ms: float, steps: int | None = None) -> float:
    """A p2p op: ``max(host, device)``. The host enqueues a fixed part plus one batch_isend_irecv on a
    side stream (with its events and waits) per ring step (``steps``, default ws - 1); the device
    runs the ring. Small shapes are host-bound (0.5 ms at ws 2, 1.3 ms at ws 4 measured)."""
    steps = ws - 1 if steps is None else steps
    return max(cal.p2p_call_ms + steps * cal.p2p_step_ms, device_ms)


# ------------------------------------------------------------------------------------- per op
def baseline(cal: Calibration, p: Problem) -> tuple[float, dict[str, float]]:
    """The plain graph: GEMM(s) and the collective(s), one after the other."""
    e, ws, dt = p.e, p.ws, p.dtype
    if p.op == "ag_mm":
        g = p.gemms * gemm_ms(cal, p.m, p.n / p.gemms, p.k, dt)
        c = coll_ms(cal, "all_gather", p.m * p.k * e, ws)
    elif p.op == "mm_rs":
        g = gemm_ms(cal, p.m, p.n, p.k, dt)
        c = coll_ms(cal, "reduce_scatter", p.m * p.n * e, ws)
    elif p.op == "mm_ar":
        g = gemm_ms(cal, p.m, p.n, p.k, dt)
        c = coll_ms(cal, "all_reduce", p.m * p.n * e, ws)
    elif p.op == "cta_pipeline_mlp":
        g = _mlp_ms(cal, p, p.m)
        c = coll_ms(cal, "all_reduce", p.m * p.n * e, ws)
    else:  # moe_experts: dispatch, experts (rows gathered into expert order and scattered back), combine
        g = _experts_ms(cal, p, p.m, compute_eff=knobs.cost.BASE_GROUPED_EFF) + mem_ms(cal, 4 * p.m * p.k * e)
        c = 2 * coll_ms(cal, "all_to_all", p.rows_sent * p.k * e, ws)
    return knobs.cost.SEQ_FACTOR * (g + c), {"gemm_ms": g, "comm_ms": c}


def _mlp_ms(cal: Calibration, p: Problem, rows: float, eff: float = 1.0) -> float:
    """This rank's MLP on ``rows`` rows: up (and gate) projection, activation, down projection."""
    gate = 2 if p.activation == "swiglu" else 1
    act = mem_ms(cal, rows * p.f * p.e * (gate + 1))
    return gemm_ms(cal, rows, gate * p.f, p.k, p.dtype, eff) + act + gemm_ms(cal, rows, p.n, p.f, p.dtype, eff)


def _experts_ms(cal: Calibration, p: Problem, rows: float, eff: float = 1.0, compute_eff: float = 1.0) -> float:
    """The SwiGLU experts on ``rows`` grouped rows, spread evenly over the experts."""
    per = rows / max(1, p.experts)
    one = (2 * gemm_ms(cal, per, p.f, p.k, p.dtype, eff, compute_eff)
           + gemm_ms(cal, per, p.k, p.f, p.dtype, eff, compute_eff))
    return max(1, p.experts) * one + mem_ms(cal, rows * p.f * p.e * 3)


def plan_p2p(cal: Calibration, p: Problem, stages: int | None = None) -> Plan:
    e, ws, dt, slow = p.e, p.ws, p.dtype, knobs.cost.P2P_GEMM_SLOWDOWN
    if p.op == "ag_mm":
        g = p.gemms * gemm_ms(cal, p.m / ws, p.n / p.gemms, p.k, dt) * slow
        x = p2p_ms(cal, p.m * p.k * e / ws, ws)
        dev = (ws - 1) * max(g, x) + g  # each step's GEMM on the chunk here while the next one travels
        return Plan("p2p", _p2p_time(cal, ws, dev), ws, terms={"chunk_gemm_ms": g, "chunk_transfer_ms": x,
                                                                "device_ms": dev})
    if p.op in ("mm_rs", "mm_ar"):
        rows = p.m if p.op == "mm_rs" else -(-p.m // ws) * ws
        chunk = rows * p.n * e / ws
        g = gemm_ms(cal, rows / ws, p.n, p.k, dt) * slow
        add = mem_ms(cal, 3 * chunk)
        x = p2p_ms(cal, chunk, ws)
        dev = g + (ws - 1) * max(g + add, x)  # partials computed while the accumulators travel
        t = _p2p_time(cal, ws, dev)
        terms = {"chunk_gemm_ms": g, "chunk_transfer_ms": x, "device_ms": dev}
        if p.op == "mm_ar":  # then an NCCL all-gather of the reduced chunks, not overlapped
            terms["all_gather_ms"] = coll_ms(cal, "all_gather", rows * p.n * e, ws)
            t += terms["all_gather_ms"]
        return Plan("p2p", t, ws, terms=terms)
    if p.op == "cta_pipeline_mlp":
        return min((_cta_p2p(cal, p, s) for s in _stage_candidates(p, stages)), key=lambda pl: pl.ms)
    # moe_experts: per source rank, its rows' experts while the previous results travel back
    g = _experts_ms(cal, p, p.m / ws) * slow
    x = p2p_ms(cal, p.rows_sent * p.k * e / ws, ws)
    dev = x + (ws - 1) * max(g, x) + g
    # dispatch and combine steps, and one host read of the [ws, E] counts (a synchronisation)
    t = _p2p_time(cal, ws, dev, steps=2 * (ws - 1) + 1)
    return Plan("p2p", t, ws, terms={"chunk_gemm_ms": g, "chunk_transfer_ms": x, "device_ms": dev})


def _stage_candidates(p: Problem, stages: int | None) -> list[int]:
    if stages is not None:
        return [stages]
    return [s for s in knobs.cost.CTA_STAGES if s == 1 or p.m // s >= p.ws] or [1]


def _cta_p2p(cal: Calibration, p: Problem, stages: int) -> Plan:
    """Micro-chunks of ``m / stages`` rows, each reduced by mm_ar's fused ring; each chunk's
    all-gather overlaps the next chunk, the last one's follows the last GEMM."""
    e, ws = p.e, p.ws
    s = max(1, min(stages, p.m))
    rows = p.m / s
    g = _mlp_ms(cal, p, rows / ws) * knobs.cost.P2P_GEMM_SLOWDOWN
    x = p2p_ms(cal, rows / ws * p.n * e, ws)
    chunk = g + (ws - 1) * max(g, x)
    last_ag = coll_ms(cal, "all_gather", rows * p.n * e, ws)
    t = _p2p_time(cal, ws, s * chunk, steps=s * ws) + last_ag  # ring steps and an all-gather per chunk
    return Plan("p2p", t, s * ws, stages=stages, terms={"chunk_ms": chunk, "last_all_gather_ms": last_ag})


def plan_symm(cal: Calibration, p: Problem, stages: int | None = None, comm_sms: int | None = None) -> Plan | None:
    """The symm lowering's plan, or None where its kernels do not run this problem (it would run on p2p)."""
    e, ws, dt = p.e, p.ws, p.dtype
    host = cal.symm_call_ms
    if p.op == "ag_mm" and _ag_on_cublas(p, cal):
        # runtime.symm.ag_mm.ag_mm_cublas: each chunk's GEMMs on cuBLAS, the own chunk first, each
        # peer's chunk once it arrived (they arrive one after the other: every rank pushes to r-1 first);
        # where the path was measured against one GEMM (bench_kernels' ag_mm_cublas), a ws-th of that
        form = kernel_eff(cal, "ag_mm_cublas", p.m, p.k, p.n, ws, dt)
        chunk_g = (form * p.gemms * gemm_ms(cal, p.m, p.n / p.gemms, p.k, dt) / ws if form is not None
                   else p.gemms * gemm_ms(cal, p.m / ws, p.n / p.gemms, p.k, dt))
        x = ce_ms(cal, p.m * p.k * e / ws)  # one peer's shard
        done = chunk_g
        for j in range(1, ws):
            done = max(done, j * x) + chunk_g
        return _symm_plan(host["ag_mm"], knobs.cost.SYMM_DEVICE_MS + done, ws,
                          {"gemm_ms": ws * chunk_g, "transfer_ms": (ws - 1) * x, "cublas_gemms": 1.0})
    if p.op == "ag_mm":
        # (looked up with all the weights' columns, as ag_gemm does and bench_kernels measures them)
        eff = kernel_eff(cal, "ag_mm", p.m, p.k, p.n, ws, dt) or knobs.cost.TRITON_EFF
        g = p.gemms * gemm_ms(cal, p.m, p.n / p.gemms, p.k, dt, eff)
        x = ce_ms(cal, (ws - 1) * p.m * p.k * e / ws)  # the peers' shards into this rank
        nb = bands(p.m // ws)
        dev = knobs.cost.SYMM_DEVICE_MS + max(g, x + g / (ws * nb))  # the last band's GEMM follows its arrival
        return _symm_plan(host["ag_mm"], dev, ws * nb, {"gemm_ms": g, "transfer_ms": x, "gemm_ratio": eff,
                                                          "cublas_gemms": 0.0})
    if p.op == "mm_rs":
        chunk = p.m * p.n * e / ws
        # the GEMM at the measured ratio of the path the runtime takes (the kernel's, or the cuBLAS path's:
        # both include reading and summing the partials), else cuBLAS's (on cuBLAS) or TRITON_EFF, plus
        # the sum's memory traffic
        on_cublas = _rs_on_cublas(p, cal)
        measured = kernel_eff(cal, "mm_rs_cublas" if on_cublas else "mm_rs", p.m, p.k, p.n, ws, dt)
        g = gemm_ms(cal, p.m, p.n, p.k, dt, measured or (1.0 if on_cublas else knobs.cost.TRITON_EFF))
        x = ce_ms(cal, (ws - 1) * chunk)  # the peers' partials of this rank's chunk
        nb = bands(p.m // ws)
        # each band pushed as its tiles finish; the own chunk last, then the sum of the partials
        dev = knobs.cost.SYMM_DEVICE_MS + max(g, g / (ws * nb) + x) + (
            0.0 if measured else mem_ms(cal, (ws - 1) * chunk))
        return _symm_plan(host["mm_rs"], dev, ws * nb, {"gemm_ms": g, "transfer_ms": x, "cublas_gemms": float(on_cublas)})
    if p.op == "mm_ar":
        total = p.m * p.n * e
        if total <= knobs.symm.ONESHOT_MAX_BYTES:  # cuBLAS partial, pushed whole to every peer, summed
            g = gemm_ms(cal, p.m, p.n, p.k, dt)
            x = ce_ms(cal, (ws - 1) * total)
            # the sum: torch.sum's roofline, times the one-shot kernel's measured ratio to it where the
            # runtime sums with the kernel (runtime.symm.mm_ar.oneshot_sum)
            on_torch = _oneshot_on_torch(p, cal)
            ratio = 1.0 if on_torch else kernel_eff(cal, "oneshot", p.m, 1, p.n, ws, dt) or 1.0
            summed = (mem_ms(cal, (ws + 1) * total) + cal.launch_ms) * ratio
            dev = knobs.cost.SYMM_DEVICE_MS + g + x + summed
            return _symm_plan(host["mm_ar_oneshot"], dev, 1, {"gemm_ms": g, "transfer_ms": x, "sum_ms": summed,
                                                               "sum_ratio": ratio, "torch_sum": float(on_torch)})
        rounds = ar_rounds(p.m, ws)
        chunk = total / (rounds * ws)
        on_cublas = _ar_on_cublas(p, cal)
        if on_cublas:  # the cuBLAS path's measured ratio (bench_kernels' mm_ar_cublas), else cuBLAS's own
            eff = kernel_eff(cal, "mm_ar_cublas", p.m, p.k, p.n, ws, dt) or 1.0
        else:
            eff = (kernel_eff(cal, "mm_ar", p.m, p.k, p.n, ws, dt)
                   or (kernel_eff(cal, "mm_rs", -(-p.m // ws) * ws, p.k, p.n, ws, dt) if rounds == 1 else None)
                   or knobs.cost.TRITON_EFF)
        g = gemm_ms(cal, p.m, p.n, p.k, dt, eff)
        per_round = 2 * ce_ms(cal, (ws - 1) * chunk)  # reduce-scatter partials in, reduced chunk out
        dev = knobs.cost.SYMM_DEVICE_MS + max(g + per_round, rounds * per_round) + mem_ms(cal, (ws - 1) * chunk)
        return _symm_plan(host["mm_ar"], dev, rounds * ws * bands(p.m // (rounds * ws)),
                          {"gemm_ms": g, "transfer_ms": rounds * per_round, "gemm_ratio": eff,
                           "cublas_gemms": float(on_cublas)})
    if p.op == "cta_pipeline_mlp":
        if ws % 2 or (stages is not None and stages != 2):
            return None  # the kernels run 2 stages of ws/2 ranks; anything else falls back to p2p
        tp = ws // 2
        gate = 2 if p.activation == "swiglu" else 1
        big_f = p.f * ws
        flops = (2.0 * p.m * p.k * big_f * gate + 2.0 * p.m * big_f * p.n) / ws  # balanced stages
        weights = (p.k * big_f * gate + big_f * p.n) * e / ws
        stage_eff = _cta_eff(cal, p, tp, big_f, gate)
        stage = cal.launch_ms + max(flops / (cal.rate(dt) * 1e9), weights / (cal.hbm_gbps * 1e6)) * stage_eff
        import torch

        from ..runtime import cta_plan

        # the runtime's own plan of this call: its tiles, row groups and split-K runs
        plan = cta_plan.chunk_plan(p.m, big_f, p.n, tp, gate == 2, getattr(torch, dt), cal.num_sms, H=p.k)
        block_n1 = plan.cfg1[1]
        tiles_n1, most, groups = -(-(p.n // tp) // block_n1), plan.cfg1[3], plan.groups
        # The pipeline's fill is hidden by the stage-1 share (stage 1's own first-GEMM columns) and its
        # drain by the stage-0 tails; what is left at the end is the last row group's transfers: its
        # tails' partial products to the stage-1 ranks and their rows back to every rank, one after
        # the other, or at once with one stage-0 rank (knobs.cta.SHIP_BEFORE_TAILS).
        last = ce_ms(cal, p.m * p.n * e / groups)
        end = last * (1 if tp == 1 else 2)
        # Stage 1 streams its W2 columns and the W1 columns of its share with tiles_m x tiles_n1 CTAs
        # (a row group at a time): fewer than CTA_BW_SMS of the SMs cannot saturate the memory
        share = (big_f // (2 * (tp + 1)) * 2 if gate == 2
                 else min(cal.num_sms // most * block_n1, int(knobs.cta.GELU_SHARE_MAX * big_f)))
        stage1_bytes = (big_f * (p.n // tp) + share * p.k) * e
        active = min(cal.num_sms, most * tiles_n1 * plan.split1)
        bw = cal.hbm_gbps * min(1.0, active / (knobs.cost.CTA_BW_SMS * cal.num_sms))
        stage = max(stage, cal.launch_ms + stage1_bytes / (bw * 1e6))
        dev = knobs.cost.SYMM_DEVICE_MS + stage + end
        return _symm_plan(host["cta_pipeline_mlp"], dev, groups * knobs.cta.K_CHUNKS,
                          {"stage_ms": stage, "end_ms": end}, stages=2)
    # moe_experts (runtime/moe_symm.py's defaults: phased schedule, copy-engine combine): the persistent
    # expert GEMMs on the SMs the comm kernel leaves (MOE_SYMM_EFF, tiles of MOE_TILE_ROWS rows per
    # (source, expert) group), one launch pair per source position; each remote source's results leave
    # after its phase (copy engine, then copied out on the source rank: by the comm kernel on c SMs, or
    # with c = 0 by the copy engine, which reads and writes each byte in HBM), so only the last remote
    # source's share can outlast the last phase (the own rows)
    cands = [comm_sms] if comm_sms is not None else [c for c in knobs.cost.MOE_COMM_SMS if c <= cal.num_sms // 2]
    groups = ws * max(1, p.experts)
    # every (source, expert) group ends in a partial tile: routed group sizes are never whole tiles, even
    # where the total is (4096 tokens x top-2 = 8192 rows over 8 groups priced Mixtral-like at 2 GPUs 4.78 ms,
    # a rewrite, where 8330 received rows measured 5.438 against the baseline's 5.368; docs/cost_model.md)
    padded = (p.m // (groups * knobs.cost.MOE_TILE_ROWS) + 1) * groups * knobs.cost.MOE_TILE_ROWS if p.m else 0
    grouped = _moe_on_grouped_mm(p, cal)
    best = None
    for c in cands:
        sms = max(1, cal.num_sms - c)
        if grouped:  # torch._grouped_mm, as the plain graph's experts (ratio 1 to them), on the rows as they are
            g = _experts_ms(cal, p, p.m, compute_eff=knobs.cost.BASE_GROUPED_EFF) * cal.num_sms / sms
        else:  # the persistent expert kernel on tile-padded rows (MOE_SYMM_EFF: fitted on it end to end)
            g = _experts_ms(cal, p, padded, knobs.cost.MOE_SYMM_EFF) * cal.num_sms / sms
        moved = (ws - 1) * p.rows_sent * p.k * e / ws
        first = ce_ms(cal, p.rows_sent * p.k * e / ws)  # the first source's rows arrive (copy engine)
        copy_out = moved / (c * knobs.cost.SM_PULL_GBPS * 1e6) if c else mem_ms(cal, 2 * moved)
        comm = ce_ms(cal, moved) + copy_out  # returned by copy engine, then copied out
        tail = max(0.0, comm / max(1, ws - 1) - g / ws)
        dev = knobs.cost.SYMM_DEVICE_MS + first + g + tail
        plan = _symm_plan(host["moe_experts"], dev, ws, {"gemm_ms": g, "transfer_ms": comm, "tail_ms": tail,
                                                          "cublas_gemms": float(grouped)}, comm_sms=c)
        if best is None or plan.ms < best.ms:
            best = plan
    return best


def _ag_on_cublas(p: Problem, cal: Calibration | None = None) -> bool:
    """Does the symm ag_mm of ``p`` run on cuBLAS per chunk (``runtime.symm.ag_mm.ag_gemm`` for the
    calibration's GPU; the model sees no gather layout or epilogue: one run per chunk, none)?"""
    from ..runtime.symm import ag_mm as symm_ag_mm

    return symm_ag_mm.ag_gemm(1, p.m // p.ws, p.k, p.n, ws=p.ws, dtype=p.dtype, gpu=ratio_gpu(cal)) == "cublas"


def _rs_on_cublas(p: Problem, cal: Calibration) -> bool:
    """Does the symm mm_rs of ``p`` run on cuBLAS per band (``runtime.symm.mm_rs.rs_gemm``)?"""
    from ..runtime.symm import mm_rs as symm_mm_rs

    return symm_mm_rs.rs_gemm(1, p.m // p.ws, p.k, N=p.n, ws=p.ws, dtype=p.dtype, gpu=ratio_gpu(cal)) == "cublas"


def _oneshot_on_torch(p: Problem, cal: Calibration) -> bool:
    """Does the symm mm_ar one-shot of ``p`` sum with torch (``runtime.symm.mm_ar.oneshot_sum``; the model
    sees no epilogue)?"""
    from ..runtime.symm import mm_ar as symm_mm_ar

    return symm_mm_ar.oneshot_sum(p.m, p.n, p.ws, dtype=p.dtype, gpu=ratio_gpu(cal)) == "torch"


def _ar_on_cublas(p: Problem, cal: Calibration) -> bool:
    """Does the symm mm_ar rounds path of ``p`` run on cuBLAS (``runtime.symm.mm_ar.ar_gemm``)?"""
    from ..runtime.symm import mm_ar as symm_mm_ar

    return symm_mm_ar.ar_gemm(p.m, p.k, p.ws, N=p.n, dtype=p.dtype, gpu=ratio_gpu(cal)) == "cublas"


# GPU names (as torch reports them) of the calibrations' device classes: the kernel ratios are per GPU name
RATIO_GPUS = {"h200": "NVIDIA H200", "h100": "NVIDIA H100 80GB HBM3"}


def ratio_gpu(cal: Calibration | None) -> str | None:
    """The GPU whose measured kernel ratios (``spec/kernel_ratios.py``) stand for ``cal``'s machine."""
    name = RATIO_GPUS.get(getattr(cal, "device_class", ""))
    return name if name is not None else kernel_ratios.gpu_name()


def kernel_eff(cal: Calibration, kernel: str, m: int, k: int, n: int, ws: int, dtype: str,
               fused: bool = False) -> float | None:
    """The measured kernel / cuBLAS time ratio of ``kernel`` near this local GEMM on the calibration's
    GPU (None: not measured near it; the fitted constants stand in)."""
    return kernel_ratios.measured_ratio(kernel, int(m), int(k), int(n), ws=ws, dtype=dtype, gpu=ratio_gpu(cal),
                                        fused=fused)


def _cta_eff(cal: Calibration, p: Problem, tp: int, big_f: int, gate: int) -> float:
    """A CTA-pipeline stage's time over cuBLAS's: the flop-weighted ratios of stage 0 and stage 1 at this
    call's local GEMMs, each by the path it takes (``cta_stage_gemm``): on cuBLAS the form's measured ratio
    (``cta_cublas.form_ratio``), else 1; else the kernel's measured ratio (GELU only: the bench measures those;
    stage 0 with its fused activation), else CTA_EFF."""
    from ..runtime import cta_cublas

    def ratio(stage: int, m: int, k: int, n: int) -> float:
        if cta_stage_gemm(stage, cal, p, m, k, n, gate) == "cublas":
            form = cta_cublas.form_ratio(f"cta_stage{stage}", int(m), int(k), int(n), ws=p.ws, dtype=p.dtype,
                                         gpu=ratio_gpu(cal), fused=stage == 0) if gate == 1 else None
            return form if form is not None else 1.0
        r = kernel_eff(cal, f"cta_stage{stage}", m, k, n, p.ws, p.dtype, fused=stage == 0) if gate == 1 else None
        return r if r is not None else knobs.cost.CTA_EFF

    r0, r1 = ratio(0, p.m, p.k, big_f // tp), ratio(1, p.m, big_f, p.n // tp)
    f0, f1 = gate * p.k * big_f, big_f * p.n  # the two GEMMs' flops (over the same rows)
    return (r0 * f0 + r1 * f1) / (f0 + f1)


def cta_stage_gemm(stage: int, cal: Calibration, p: Problem, m: int, k: int, n: int, gate: int) -> str:
    """The path of CTA stage ``stage``'s GEMM (local [m, k] @ [k, n]): the runtime's own decision
    (``runtime/cta_cublas.stage_form``: ``knobs.cta.STAGE0_GEMM`` / ``STAGE1_GEMM``) on the calibration's GPU."""
    from ..runtime import cta_cublas

    return cta_cublas.stage_form(stage, int(m), int(k), int(n), p.ws, p.dtype, gpu=ratio_gpu(cal))


def _moe_on_grouped_mm(p: Problem, cal: Calibration) -> bool:
    """Does ``moe_experts``' symm lowering compute its experts with ``torch._grouped_mm``
    (``knobs.moe.EXPERT_GEMM``; "auto": where the form measured faster, ``moe_grouped.grouped_wins``)?
    The weights' layout constraints the runtime also checks are assumed met."""
    from ..runtime import moe_grouped

    mode = knobs.moe.EXPERT_GEMM
    if mode == "auto":
        return moe_grouped.grouped_wins(p.m, p.k, p.f, p.ws, p.dtype, gpu=ratio_gpu(cal))[0]
    return mode == "grouped_mm"


def _symm_plan(host_ms: float, dev_ms: float, chunks: int, terms: dict, **kw) -> Plan:
    return Plan("symm", max(host_ms, dev_ms), chunks, terms={**terms, "device_ms": dev_ms, "host_ms": host_ms}, **kw)


def predict(p: Problem, cal: Calibration, lowerings: Sequence[str] = ("p2p",), *, stages: int | None = None,
            comm_sms: int | None = None, cuda_graphs: bool = False) -> Prediction:
    """The baseline and one plan per candidate lowering (in preference order; a ``symm`` that cannot
    run ``p`` is dropped). ``stages`` / ``comm_sms``: fixed knobs, or None to choose by the model.
    ``cuda_graphs``: the graph is replayed from a CUDA graph (see the module's docstring)."""
    base, terms = baseline(cal, p)
    if cuda_graphs and p.op in GRAPH_OPS:
        from ..spec import knobs

        p2p_host = {} if p.op in GRAPH_P2P_HOST_KEPT else {"p2p_call_ms": 0.0, "p2p_step_ms": 0.0}
        cal = dataclasses.replace(cal, **p2p_host, symm_call_ms=dict.fromkeys(cal.symm_call_ms, 0.0))
        if not knobs.symm.CAPTURE_ON_SYMM and p.op != "cta_pipeline_mlp":  # (cta: always captured on symm)
            lowerings = [low for low in lowerings if low != "symm"] or ["p2p"]
    elif p.op in PRIVATE_GRAPH_OPS and (p.op != "moe_experts" or p.fixed_splits):
        from ..spec import knobs

        if knobs.symm.PRIVATE_GRAPHS:
            cal = dataclasses.replace(cal, symm_call_ms={k: 0.0 if k.startswith(p.op) else v
                                                         for k, v in cal.symm_call_ms.items()})
    plans = []
    for low in dict.fromkeys(lowerings):
        plan = plan_symm(cal, p, stages, comm_sms) if low == "symm" else plan_p2p(cal, p, stages)
        if plan is not None:
            plans.append(plan)
    if not plans:
        plans.append(plan_p2p(cal, p, stages))
    if p.prologue_bytes or p.fold_bytes:
        base, terms = _with_prologue(cal, p, base, terms, plans)
    return Prediction(p, base, terms, plans, cal, cuda_graphs and p.op in GRAPH_OPS)


def _with_prologue(cal: Calibration, p: Problem, base: float, terms: dict[str, float], plans: list[Plan]):
    """An ``ag_mm`` prologue: the plain graph runs it on the gathered rows; the rewrite on the shard,
    plus the folds (bench/probe_prologue.py measured both sides on one H200: docs/passes.md)."""
    plain = mem_ms(cal, p.prologue_bytes)
    moved = mem_ms(cal, p.prologue_bytes / p.ws) + mem_ms(cal, p.fold_bytes) + p.folds * cal.launch_ms
    for plan in plans:
        plan.ms += moved
        plan.terms["prologue_ms"] = moved
    return base + plain, {**terms, "prologue_ms": plain}


__all__ = ["ELEMENT_BYTES", "GRAPH_OPS", "OPS", "PRIVATE_GRAPH_OPS", "Plan", "Prediction", "Problem", "ar_rounds", "bands", "baseline",
           "ce_ms", "coll_ms", "gemm_ms", "mem_ms", "p2p_ms", "plan_p2p", "plan_symm", "predict"]
