"""The GPU smoke set (markers ``gpu`` and ``gpu_smoke``): every op under ``symm`` once at 2 ranks, eager
and captured in a CUDA graph, plus the timeout and dead-peer paths, within one device call on a fresh
machine (cold Triton cache, every rank compiling). ``bench/run_device.sh smoke`` runs it (ranks sharing
GPU 0 where the machine has one GPU: ``OVERLAP_TEST_SHARED_GPU=1``).

Few shapes, chosen so that the cases share compiled kernel variants (the empty-K cases run as a
contraction over 64 zeros: the K of the kernel cases), and one spawned process group per test:

- ``test_symm_ops_eager_and_captured``: ``ag_mm`` (the consumer kernel, cuBLAS per chunk with the gathered
  input), ``mm_rs`` (the producer kernel, cuBLAS bands), ``mm_ar`` (one-shot, rounds on the kernel),
  empty K / N of all three, ``moe_experts`` (balanced routing, grouped rows pointing nowhere, offsets and
  group sizes), ``moe_experts_backward`` (its only lowering is ``p2p``, which gloo cannot run point to
  point on CUDA tensors: on a group of one rank, which has no transfers), ``cta_pipeline_mlp`` (buffers
  poisoned before the checked call); then the GEMM ops captured in one CUDA graph, ``moe_experts`` and
  ``cta_pipeline_mlp`` in graphs of their own, replayed on fresh inputs with eager calls in between;
- ``test_symm_timeouts_and_dead_peers``: a late peer (``SymmTimeoutError`` naming op, rank and flag), a
  dead peer (the watchdog releases the stream waits) eager and in a replay, each on a group of its own
  (a group that timed out stays unusable);
- ``tests/gpu/test_gpu_cta.py::test_cta_pipeline_symm_compiled`` (also ``gpu_smoke``): the compiled MLP.

Every case runs even when an earlier one failed; a test's failure lists each failing case and rank.
"""

from __future__ import annotations

import math
import os
import time
import traceback
import zlib

os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})

import pytest  # noqa: E402
import torch  # noqa: E402

try:
    import test_gpu as g
    import test_gpu_cta as gc
    import test_gpu_moe as gm
except ImportError:  # imported as tests.gpu.test_gpu_smoke
    from tests.gpu import test_gpu as g, test_gpu_cta as gc, test_gpu_moe as gm

pytestmark = [pytest.mark.gpu, pytest.mark.gpu_smoke]
BF16 = torch.bfloat16
TOL = 1e-2


def _took(before: dict) -> dict:
    after = g._paths()
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def _check(errs: dict, paths: dict | None = None, want: dict | None = None) -> str:
    bad = {k: v for k, v in errs.items() if not v <= TOL}
    assert not bad, f"rel errs over {TOL:g}: {bad} (all: {errs})"
    missing = {k: n for k, n in (want or {}).items() if (paths or {}).get(k, 0) < n}
    assert not missing, f"paths {paths}: expected at least {want}"
    return f"max rel err {max(errs.values()):.1e}; paths {paths}"


# ------------------------------------------------------------------------- the ops, eager
def case_ag_mm(rank, ws, group):
    before = g._paths()
    errs = {"consumer kernel (3-D, gather dim 1)": g._case_ag_mm(group, BF16, "cuda", "symm", lead=(3, 11), k=96,
                                                                 ns=(56,), dim=1, with_bias=False),
            "cuBLAS per chunk, gathered, bias": g._case_ag_mm(group, BF16, "cuda", "symm", lead=(64,), k=128,
                                                              ns=(256,), dim=0, with_bias=True)}
    return _check(errs, _took(before), {"ag_mm:symm:triton": 1, "ag_mm:symm:cublas": 1})


def case_mm_rs(rank, ws, group):
    before = g._paths()
    errs = {"producer kernel, bias": g._case_mm_rs(group, BF16, "cuda", "symm", lead=(ws * 64,), k=64, n=128, dim=0,
                                                   with_bias=True),
            "cuBLAS bands, K 2048, avg": g._case_mm_rs(group, BF16, "cuda", "symm", lead=(ws * 600,), k=2048, n=136,
                                                       dim=0, with_bias=False, reduce_op="avg")}
    return _check(errs, _took(before), {"mm_rs:symm:triton": 1, "mm_rs:symm:cublas": 1})


def case_mm_ar(rank, ws, group):
    before = g._paths()
    errs = {"one-shot, bias": g._case_mm_ar(group, BF16, "cuda", "symm", m=91, k=64, n=152, with_bias=True)}
    oneshot = _took(before)
    errs["rounds (kernel), bias"] = g._case_mm_ar(group, BF16, "cuda", "symm", m=2100, k=64, n=1032, with_bias=True)
    took = _took(before)
    assert oneshot.get("mm_ar:oneshot") == 1 and took.get("mm_ar:oneshot") == 1, took  # the second: rounds
    assert not took.get("mm_ar:symm:cublas"), took
    return _check(errs, took, {"mm_ar:symm": 2})


def case_empty_k_n(rank, ws, group):
    """K = 0 and N = 0 of the three ops, as eager computes them (per-rank biases, so the K = 0 ones are
    reduced over the ranks); ag_mm K = 0 and the N = 0 ones send nothing."""
    gn = group.group_name
    ov = torch.ops.overlap
    bias = g._randn(128, dtype=BF16, device="cuda")
    errs, shapes = {}, []
    before = g._paths()
    # ag_mm K = 0: the gathered tensor has no elements, the output is the bias
    gathered, (out,) = ov.ag_mm(torch.empty(64, 0, dtype=BF16, device="cuda"),
                                [torch.empty(0, 128, dtype=BF16, device="cuda")], [bias], 0, gn, "symm", True)
    shapes.append((list(gathered.shape), [64 * ws, 0]))
    errs["ag_mm K=0"] = g._rel_err(out, bias.float().expand(64 * ws, 128))
    # N = 0 of mm_rs and mm_ar
    a = g._randn(ws * 64, 64, dtype=BF16, device="cuda")
    shapes.append((list(ov.mm_rs(a, torch.empty(64, 0, dtype=BF16, device="cuda"), None, [ws * 64, 0], 0, "sum", gn,
                                 "symm").shape), [64, 0]))
    shapes.append((list(ov.mm_ar(a[:91], torch.empty(64, 0, dtype=BF16, device="cuda"), None, "sum", gn,
                                 "symm").shape), [91, 0]))
    silent = _took(before)
    assert not silent, f"K = 0 ag_mm / N = 0 mm_rs, mm_ar took a path: {silent}"
    # ag_mm with a weight of N = 0 next to one of 256: the other output and the gathered tensor as usual
    shard = g._randn(64, 128, dtype=BF16, device="cuda")
    w = g._randn(128, 256, dtype=BF16, device="cuda", scale=128**-0.5)
    gathered, (out, empty) = ov.ag_mm(shard, [w, torch.empty(128, 0, dtype=BF16, device="cuda")], [None, None], 0, gn,
                                      "symm", True)
    G = g._gather_ref(shard, 0, group)
    errs["ag_mm N=(256, 0): gathered"] = 0.0 if torch.equal(gathered, G) else math.inf
    errs["ag_mm N=(256, 0): out"] = g._rel_err(out, G.float() @ w.float())
    shapes.append((list(empty.shape), [64 * ws, 0]))
    # K = 0 of mm_rs and mm_ar with per-rank biases: the biases reduced over the ranks
    empty_a, empty_b = torch.empty(ws * 64, 0, dtype=BF16, device="cuda"), torch.empty(0, 128, dtype=BF16, device="cuda")
    full = g._all_reduce_ref(bias.float().expand(ws * 64, 128).contiguous(), group)
    errs["mm_rs K=0, bias"] = g._rel_err(ov.mm_rs(empty_a, empty_b, bias, [ws * 64, 128], 0, "sum", gn, "symm"),
                                         full.chunk(ws)[rank])
    bias_ar = g._randn(152, dtype=BF16, device="cuda")
    errs["mm_ar K=0, bias"] = g._rel_err(
        ov.mm_ar(torch.empty(91, 0, dtype=BF16, device="cuda"), torch.empty(0, 152, dtype=BF16, device="cuda"),
                 bias_ar, "sum", gn, "symm"),
        g._all_reduce_ref(bias_ar.float().expand(91, 152).contiguous(), group))
    assert all(got == want for got, want in shapes), shapes
    return _check(errs, _took(before), {"ag_mm:symm": 1, "mm_rs:symm": 1, "mm_ar:symm": 1})


def case_moe_experts(rank, ws, group, calls=3):
    """Balanced routing (CASES["balanced"] of test_gpu_moe.py), fresh routing and weights per call,
    grouped rows pointing nowhere in one call, offsets and group sizes, poisoned outputs."""
    gn = group.group_name
    n_rows, h, f, experts, _ = gm.CASES["balanced"]
    gen = torch.Generator().manual_seed(zlib.crc32(b"smoke moe"))  # the same on every rank
    errs = {}
    before = g._paths()
    for call in range(calls):
        counts, experts_of = gm._routing("balanced", ws, experts, gen)
        send, recv = counts[rank].tolist(), counts[:, rank].tolist()
        wg, wu = ((torch.randn(experts, h, f, device="cuda") / math.sqrt(h)).to(BF16) for _ in range(2))
        wd = (torch.randn(experts, f, h, device="cuda") / math.sqrt(f)).to(BF16)
        x = torch.randn(sum(send), h, device="cuda").to(BF16)
        e_of = experts_of[rank].to("cuda")
        rows = torch.sort(e_of, stable=True).indices
        if call == 1:
            rows[::7] = -1
        ends = torch.cumsum(torch.bincount(e_of, minlength=experts), 0)
        ref = gm._reference(x, send, recv, rows, ends, wg, wu, wd, group)
        gm._poison(x.numel() * x.element_size() * 4)
        offsets = call % 2 == 0
        out, _ = torch.ops.overlap.moe_experts(
            x, send, recv, rows, ends.to(torch.int32) if offsets else None,
            [] if offsets else torch.diff(ends, prepend=ends.new_zeros(1)).tolist(), wg, wu, wd, gn, "symm", [False] * 5)
        errs[f"call {call}"] = gm._rel(out.float(), ref.float())
    return _check(errs, _took(before), {"moe_experts:symm": calls})


def case_moe_experts_backward(rank, ws, group):
    """The backward op's CUDA path (``torch._grouped_mm`` on the transposed weights, ``index_add_``) on a
    group of this rank alone, against autograd through float32 experts."""
    import torch.distributed as dist
    import torch.nn.functional as F

    own = [dist.new_group([r]) for r in range(ws)][rank]  # every rank creates every group
    _, h, f, experts, _ = gm.CASES["balanced"]
    m = 384
    gen = torch.Generator().manual_seed(5)
    w = [(torch.randn(experts, *shape, device="cuda") / math.sqrt(shape[0])).to(BF16) for shape in ((h, f), (h, f), (f, h))]
    e_of = torch.randint(0, experts, (m,), generator=gen).to("cuda")
    rows = torch.sort(e_of, stable=True).indices
    rows[::7] = -1  # grouped rows pointing nowhere get no gradient
    ends = torch.cumsum(torch.bincount(e_of, minlength=experts), 0)
    grad = torch.randn(m, h, device="cuda")
    xg = torch.randn(m, h, device="cuda").to(BF16).float()
    gate, up = torch.zeros(m, f, device="cuda"), torch.zeros(m, f, device="cuda")
    lo = 0
    for e, hi in enumerate(ends.tolist()):
        gate[lo:hi], up[lo:hi] = xg[lo:hi] @ w[0][e].float(), xg[lo:hi] @ w[1][e].float()
        lo = hi
    gate, up = gate.to(BF16).float().requires_grad_(), up.to(BF16).float().requires_grad_()
    dy = torch.where((rows >= 0)[:, None], grad[rows.clamp(min=0)], 0).to(BF16).float()
    act, y, lo = F.silu(gate) * up, [], 0
    for e, hi in enumerate(ends.tolist()):
        y.append(act[lo:hi] @ w[2][e].float())
        lo = hi
    (torch.cat(y) * dy).sum().backward()
    dxg, lo = torch.zeros(m, h, device="cuda"), 0
    for e, hi in enumerate(ends.tolist()):
        dxg[lo:hi] = gate.grad[lo:hi] @ w[0][e].float().T + up.grad[lo:hi] @ w[1][e].float().T
        lo = hi
    dx_ref = torch.zeros(m, h, device="cuda")
    dx_ref.index_add_(0, rows[rows >= 0], dxg[rows >= 0])
    before = g._paths()
    got = torch.ops.overlap.moe_experts_backward(grad, [m], [m], rows, ends.to(torch.int32), [], gate.detach().to(BF16),
                                                 up.detach().to(BF16), *(t.transpose(1, 2) for t in w), own.group_name,
                                                 "p2p")
    errs = {name: gm._rel(v.float(), r) for name, v, r in zip(("dx", "dY", "dG", "dU"), got,
                                                             (dx_ref, dy, gate.grad, up.grad))}
    bad = {k: v for k, v in errs.items() if not v <= 2e-2}
    assert not bad, errs
    return f"max rel err {max(errs.values()):.1e}; paths {_took(before)}"


CTA_SHAPE = (300, 512, 2048, 512, "gelu", "tanh", True)  # M, H, F, N, activation, approximate, bias


def _cta_call(group, args, act, approximate):
    x, w1, b1, w3, b3, w2, b2 = args
    return torch.ops.overlap.cta_pipeline_mlp(x, w1, b1, w3, b3, w2, b2, act, approximate, 2, group.group_name, "symm")


def case_cta_pipeline_mlp(rank, ws, group):
    M, H, F, N, act, approximate, bias = CTA_SHAPE
    before = g._paths()
    args = gc._shards(ws, M, H, F, N, act, bias, BF16, "cuda")
    _cta_call(group, args, act, approximate)  # buffers, weight placement, kernels
    gc._poison(group.group_name, torch.device("cuda", torch.cuda.current_device()))
    errs = {}
    for i in range(2):
        args = gc._shards(ws, M, H, F, N, act, bias, BF16, "cuda")
        out = _cta_call(group, args, act, approximate)
        errs[f"call {i}"] = g._rel_err(out, gc._reference(args, act, approximate, group))
        assert gc._same_on_every_rank(out, group), "the ranks' results differ"
    return _check(errs, _took(before), {"cta_pipeline_mlp:symm": 3})


# ------------------------------------------------------------------------- captured
def case_captured_gemm_ops(rank, ws, group):
    """ag_mm (cuBLAS per chunk, the gathered input), mm_rs (the kernel), mm_ar one-shot and in rounds in one
    CUDA graph after eager warm-up calls; 4 replays on fresh inputs with poisoned outputs, an eager call of
    the same ops between two of them."""
    gn = group.group_name
    x = g._randn(64, 128, dtype=BF16, device="cuda")
    w_ag = g._randn(128, 256, dtype=BF16, device="cuda", scale=128**-0.5)
    a = g._randn(ws * 64, 64, dtype=BF16, device="cuda")
    w_rs = g._randn(64, 128, dtype=BF16, device="cuda", scale=0.125)
    a1, a2 = g._randn(91, 64, dtype=BF16, device="cuda"), g._randn(2100, 64, dtype=BF16, device="cuda")
    w1, w2 = (g._randn(64, n, dtype=BF16, device="cuda", scale=0.125) for n in (152, 1032))

    def ops():
        gathered, (y1,) = torch.ops.overlap.ag_mm(x, [w_ag], [None], 0, gn, "symm", True)
        y2 = torch.ops.overlap.mm_rs(a, w_rs, None, [ws * 64, 128], 0, "sum", gn, "symm")
        y3 = torch.ops.overlap.mm_ar(a1, w1, None, "sum", gn, "symm")
        y4 = torch.ops.overlap.mm_ar(a2, w2, None, "sum", gn, "symm")
        return gathered, y1, y2, y3, y4

    def check(outs, label):
        gathered, y1, y2, y3, y4 = outs
        G = g._gather_ref(x, 0, group)
        errs = {"gathered": 0.0 if torch.equal(gathered, G) else math.inf, "ag_mm": g._rel_err(y1, G.float() @ w_ag.float()),
                "mm_rs": g._rel_err(y2, g._all_reduce_ref(a.float() @ w_rs.float(), group).chunk(ws)[rank]),
                "mm_ar one-shot": g._rel_err(y3, g._all_reduce_ref(a1.float() @ w1.float(), group)),
                "mm_ar rounds": g._rel_err(y4, g._all_reduce_ref(a2.float() @ w2.float(), group))}
        assert all(v <= TOL for v in errs.values()), f"{label}: {errs}"
        return max(errs.values())

    for i in range(2):
        check(ops(), f"eager warm-up {i}")
    torch.cuda.synchronize()
    before = g._paths()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = ops()
    captured = _took(before)
    assert not any(k.endswith(":p2p") for k in captured), f"captured calls went to p2p: {captured}"
    assert captured.get("ag_mm:symm") == 1 and captured.get("mm_rs:symm") == 1 and captured.get("mm_ar:symm") == 2, captured
    worst = 0.0
    for i in range(4):
        for t in (x, a, a1, a2):
            t.copy_(torch.randn(t.shape, device="cuda").to(BF16))
        for t in static:
            t.fill_(float("nan"))
        graph.replay()
        worst = max(worst, check(static, f"replay {i}"))
        if i == 1:
            worst = max(worst, check(ops(), "eager call between replays"))
    torch.cuda.synchronize()
    del graph
    return f"captured {captured}; 4 replays + an eager call, max rel err {worst:.1e}"


def case_captured_moe_experts(rank, ws, group):
    """test_gpu_moe.py's captured worker (copy-engine combine): 12 replays, eager calls with other splits
    between them."""
    return gm.captured_worker(rank, ws, "cuda", "ce")


def case_captured_cta_pipeline_mlp(rank, ws, group):
    """The CTA op (the eager case's shape) captured once, replayed on fresh inputs with poisoned outputs,
    an eager call between two replays."""
    import torch.distributed as dist

    M, H, F, N, act, approximate, bias = CTA_SHAPE
    args = gc._shards(ws, M, H, F, N, act, bias, BF16, "cuda")
    x = args[0]
    _cta_call(group, args, act, approximate)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()  # a warm-up on the capture's stream kind first, as torch.cuda.graph wants
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _cta_call(group, args, act, approximate)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _cta_call(group, args, act, approximate)
    errs = {}
    for i in range(4):
        fresh = torch.randn(M, H, device="cuda").to(BF16)
        dist.broadcast(fresh, src=0, group=group)  # the row-parallel MLP's input is the same on every rank
        x.copy_(fresh)
        if i == 2:
            errs["eager between replays"] = g._rel_err(_cta_call(group, args, act, approximate),
                                                       gc._reference(args, act, approximate, group))
        out.fill_(float("nan"))
        graph.replay()
        errs[f"replay {i}"] = g._rel_err(out, gc._reference(args, act, approximate, group))
    torch.cuda.synchronize()
    from overlap_backend.runtime import symm

    symm.state(group.group_name, x.device).check_status()
    del graph
    return _check(errs)


def case_private_graphs(rank, ws, group):
    """``knobs.symm.PRIVATE_GRAPHS``: ag_mm (cuBLAS per chunk, the gathered input), mm_rs (the kernel), mm_ar
    (one-shot, rounds) called 8 times each on fresh values. Per key: an eager run of the captured protocol, a
    capture, replays; an output still held makes the next call capture another graph (the held one is checked
    again at the end: no replay overwrote it); new input tensors (new addresses) run eagerly, then capture. Every output
    is checked against float32 and poisoned once checked."""
    from overlap_backend.runtime.symm import private_graphs
    from overlap_backend.spec import knobs

    gn = group.group_name
    t = {"x": g._randn(64, 128, dtype=BF16, device="cuda"), "a": g._randn(ws * 64, 64, dtype=BF16, device="cuda"),
         "a1": g._randn(91, 64, dtype=BF16, device="cuda"), "a2": g._randn(2100, 64, dtype=BF16, device="cuda")}
    w_ag = g._randn(128, 256, dtype=BF16, device="cuda", scale=128**-0.5)
    w_rs = g._randn(64, 128, dtype=BF16, device="cuda", scale=0.125)
    w1, w2 = (g._randn(64, n, dtype=BF16, device="cuda", scale=0.125) for n in (152, 1032))

    def ops():
        gathered, (y1,) = torch.ops.overlap.ag_mm(t["x"], [w_ag], [None], 0, gn, "symm", True)
        return (gathered, y1, torch.ops.overlap.mm_rs(t["a"], w_rs, None, [ws * 64, 128], 0, "sum", gn, "symm"),
                torch.ops.overlap.mm_ar(t["a1"], w1, None, "sum", gn, "symm"),
                torch.ops.overlap.mm_ar(t["a2"], w2, None, "sum", gn, "symm"))

    def refs():
        G = g._gather_ref(t["x"], 0, group)
        return (G, G.float() @ w_ag.float(), g._all_reduce_ref(t["a"].float() @ w_rs.float(), group).chunk(ws)[rank],
                g._all_reduce_ref(t["a1"].float() @ w1.float(), group),
                g._all_reduce_ref(t["a2"].float() @ w2.float(), group))

    def errs_of(outs, want):
        return [0.0 if torch.equal(outs[0], want[0]) else math.inf] + [g._rel_err(o, r) for o, r in zip(outs[1:], want[1:])]

    from overlap_backend.runtime import checks

    checks.forget_checked()  # new keys: earlier cases of this process called the same shapes
    ops()  # (the keys' first calls: the eager protocol)
    torch.cuda.synchronize()
    worst, held = 0.0, None
    with knobs.symm.patch(PRIVATE_GRAPHS=True):
        before = dict(private_graphs.STATS)
        for call in range(8):
            if call == 5:  # new tensors at new addresses (the old ones still alive)
                t = {k: v.clone() for k, v in t.items()}
            for v in t.values():
                v.copy_(torch.randn(v.shape, device="cuda").to(BF16))
            outs = ops()
            want = refs()
            errs = errs_of(outs, want)
            assert all(e <= TOL for e in errs), f"call {call}: {errs}"
            worst = max(worst, *errs)
            if call == 3:
                held = (outs, want)
            else:
                for o in outs:
                    o.fill_(float("nan"))
                del o  # (a live reference keeps a graph's outputs busy)
            del outs
        torch.cuda.synchronize()
        took = {k: private_graphs.STATS[k] - before[k] for k in before}
    errs = errs_of(*held)
    assert all(e <= TOL for e in errs), f"the output held since call 3 changed: {errs}"
    # per key: call 0 eager, 1 captures, 2-3 replay, 4 captures (3's outputs held), 5 eager (new addresses, first
    # seen), 6 captures, 7 replays
    assert took["eager"] == 8 and took["captures"] == 12 and took["replays"] == 12, took
    return f"{took}; max rel err {worst:.1e}"


def case_private_graphs_cta(rank, ws, group):
    """``cta_pipeline_mlp`` on private graphs: the key's first call, an eager run of the captured protocol, a
    capture, then replays, each on fresh inputs with the output checked against float32 and poisoned."""
    import torch.distributed as dist

    from overlap_backend.runtime import checks
    from overlap_backend.runtime.symm import private_graphs

    M, H, F, N, act, approximate, bias = CTA_SHAPE
    checks.forget_checked()  # a new key: earlier cases of this process called the same shape
    args = gc._shards(ws, M, H, F, N, act, bias, BF16, "cuda")
    x = args[0]
    before = dict(private_graphs.STATS)
    errs = {}
    for i in range(6):
        fresh = torch.randn(M, H, device="cuda").to(BF16)
        dist.broadcast(fresh, src=0, group=group)  # the row-parallel MLP's input is the same on every rank
        x.copy_(fresh)
        out = _cta_call(group, args, act, approximate)
        errs[f"call {i}"] = g._rel_err(out, gc._reference(args, act, approximate, group))
        out.fill_(float("nan"))
        del out
    torch.cuda.synchronize()
    took = {k: private_graphs.STATS[k] - before[k] for k in before}
    assert took["eager"] == 1 and took["captures"] == 1 and took["replays"] == 3, took
    return f"{took}; " + _check(errs)


def case_private_graphs_moe(rank, ws, group):
    """``moe_experts`` on private graphs, one routing kept (as capacity routing sends the same splits): the
    key's first call, an eager run of the captured protocol, a capture, then replays, each on fresh token rows
    with the output checked against float32 and poisoned; then other splits run eagerly."""
    from overlap_backend.runtime import checks
    from overlap_backend.runtime.symm import private_graphs

    gn = group.group_name
    n_rows, h, f, experts, _ = gm.CASES["balanced"]
    gen = torch.Generator().manual_seed(zlib.crc32(b"smoke moe private"))  # the same on every rank
    checks.forget_checked()  # a new key: earlier cases of this process called the same weights' shapes
    counts, experts_of = gm._routing("balanced", ws, experts, gen)
    send, recv = counts[rank].tolist(), counts[:, rank].tolist()
    wg, wu = ((torch.randn(experts, h, f, device="cuda") / math.sqrt(h)).to(BF16) for _ in range(2))
    wd = (torch.randn(experts, f, h, device="cuda") / math.sqrt(f)).to(BF16)
    x = torch.randn(sum(send), h, device="cuda").to(BF16)
    e_of = experts_of[rank].to("cuda")
    rows = torch.sort(e_of, stable=True).indices
    ends = torch.cumsum(torch.bincount(e_of, minlength=experts), 0)
    offsets = ends.to(torch.int32)
    before = dict(private_graphs.STATS)
    errs = {}
    for call in range(6):
        x.copy_(torch.randn(x.shape, device="cuda").to(BF16))
        ref = gm._reference(x, send, recv, rows, ends, wg, wu, wd, group)
        out, saved = torch.ops.overlap.moe_experts(x, send, recv, rows, offsets, [], wg, wu, wd, gn, "symm",
                                                   [False] * 5)
        errs[f"call {call}"] = gm._rel(out.float(), ref.float())
        out.fill_(float("nan"))
        del out, saved  # (a live output of a replay keeps its graph busy: the next call would capture another)
    torch.cuda.synchronize()
    took = {k: private_graphs.STATS[k] - before[k] for k in before}
    assert took["eager"] == 1 and took["captures"] == 1 and took["replays"] == 3, took
    # other routing, the same key: new splits and rows, run eagerly (first seen) on the captured protocol
    counts, experts_of = gm._routing("balanced", ws, experts, gen)
    send, recv = counts[rank].tolist(), counts[:, rank].tolist()
    x = torch.randn(sum(send), h, device="cuda").to(BF16)
    e_of = experts_of[rank].to("cuda")
    rows = torch.sort(e_of, stable=True).indices
    ends = torch.cumsum(torch.bincount(e_of, minlength=experts), 0)
    ref = gm._reference(x, send, recv, rows, ends, wg, wu, wd, group)
    out, _ = torch.ops.overlap.moe_experts(x, send, recv, rows, ends.to(torch.int32), [], wg, wu, wd, gn, "symm",
                                           [False] * 5)
    errs["other splits"] = gm._rel(out.float(), ref.float())
    return f"{took}; " + _check(errs)


OPS_CASES = {
    "ag_mm": case_ag_mm, "mm_rs": case_mm_rs, "mm_ar": case_mm_ar, "empty K/N": case_empty_k_n,
    "moe_experts": case_moe_experts, "moe_experts_backward": case_moe_experts_backward,
    "cta_pipeline_mlp": case_cta_pipeline_mlp, "captured ag_mm, mm_rs, mm_ar": case_captured_gemm_ops,
    "captured moe_experts": case_captured_moe_experts, "captured cta_pipeline_mlp": case_captured_cta_pipeline_mlp,
    "private graphs of ag_mm, mm_rs, mm_ar": case_private_graphs, "private graphs of cta_pipeline_mlp": case_private_graphs_cta,
    "private graphs of moe_experts": case_private_graphs_moe,
}


# ------------------------------------------------------------------------- faults
def case_late_peer(rank, ws, group):
    return str(g.late_peer_worker(rank, ws, "cuda", group=group))


def case_dead_peer(rank, ws, group):
    return str(g.dead_peer_worker(rank, ws, "cuda", group=group))


def case_dead_peer_in_a_replay(rank, ws, group):
    return str(g.dead_peer_replay_worker(rank, ws, "cuda", group=group))


def case_late_peer_in_a_private_replay(rank, ws, group):
    return str(g.late_peer_private_replay_worker(rank, ws, "cuda", group=group))


FAULT_CASES = {"late peer": case_late_peer, "dead peer": case_dead_peer, "dead peer in a replay": case_dead_peer_in_a_replay,
               "late peer in a private replay": case_late_peer_in_a_private_replay}


# ------------------------------------------------------------------------- the runs
def smoke_worker(rank: int, ws: int, device: str, batch: str, fresh_groups: bool):
    """Every case of ``batch`` in order, each one's outcome kept: (ok, report or traceback, seconds). With
    ``fresh_groups`` each case gets a new group of all ranks (a case that times out leaves its group
    unusable). The ranks meet in a barrier of the world group after each case."""
    import torch.distributed as dist

    g._setup_rank(rank, device)
    cases = {"ops": OPS_CASES, "faults": FAULT_CASES}[batch]
    groups = {name: dist.new_group(list(range(ws))) if fresh_groups else dist.group.WORLD for name in cases}
    results = {}
    for name, case in cases.items():
        start = time.monotonic()
        try:
            results[name] = (True, case(rank, ws, groups[name]), time.monotonic() - start)
        except Exception:  # noqa: BLE001 - reported to the parent, the next case still runs
            results[name] = (False, traceback.format_exc(), time.monotonic() - start)
        try:
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001
            results[name] = (False, results[name][1] + "\n(and the synchronize after it failed)\n"
                             + traceback.format_exc(), results[name][2])
        dist.barrier()
    return results


def _run_batch(batch: str, fresh_groups: bool, timeout: float):
    g._need_gpus(2)
    start = time.monotonic()
    per_rank = g._run(smoke_worker, 2, batch, fresh_groups, timeout=timeout)
    took = time.monotonic() - start
    lines, bad = [], []
    for name in per_rank[0]:
        for rank, results in enumerate(per_rank):
            ok, text, seconds = results[name]
            if ok:
                lines.append(f"{name} (rank {rank}, {seconds:.1f} s): {text}")
            else:
                bad.append(f"{name} on rank {rank} ({seconds:.1f} s):\n{text}")
    print(f"{batch}: {took:.0f} s in all\n  " + "\n  ".join(lines))
    assert not bad, f"{len(bad)} failing case(s) of {len(per_rank[0])} x 2 ranks:\n" + "\n".join(bad)


@pytest.mark.timeout(300)
def test_symm_ops_eager_and_captured():
    _run_batch("ops", fresh_groups=False, timeout=280)


@pytest.mark.timeout(200)
def test_symm_timeouts_and_dead_peers():
    _run_batch("faults", fresh_groups=True, timeout=180)
