"""GPU tests (marker ``gpu``) of ``mm_ar``'s one-shot sum in both forms (``knobs.symm.ONESHOT_SUM``).

Run on the device machine: ``python -m pytest -q -m gpu tests/gpu/test_gpu_oneshot.py``, or with ranks sharing
one GPU (``OVERLAP_TEST_SHARED_GPU=1``). Same pattern as tests/gpu/test_gpu.py, whose helpers it uses.

For "triton" (the sum kernel) and "torch" (stream waits, then ``torch.sum``), in bf16 and fp32, with and without
bias, ``sum`` and ``avg``: several eager calls in a row on fresh random inputs (the same tensors refilled, so that
the private graphs capture and replay, and new tensors), then a CUDA graph of the calls captured after the eager
warm-up, replayed on fresh inputs with NaN-poisoned outputs, eager calls in between; every result against a
float32 reference (the group's all-reduce of float32 matmuls). The ``PATHS`` counters must show the form asked
for; a generated epilogue keeps the kernel under "torch".
"""

from __future__ import annotations

import pytest
import torch

try:
    from test_gpu import _all_reduce_ref, _need_gpus, _paths, _randn, _rel_err, _run, _setup_rank, _tol
except ImportError:  # imported as tests.gpu.test_gpu_oneshot
    from tests.gpu.test_gpu import _all_reduce_ref, _need_gpus, _paths, _randn, _rel_err, _run, _setup_rank, _tol

pytestmark = pytest.mark.gpu

WORLD_SIZES = pytest.mark.parametrize("ws", [2, 4], ids=["ws2", "ws4"])
FORMS = pytest.mark.parametrize("form", ["triton", "torch"])
# (M, K, N, bias, reduce_op): partials under knobs.symm.ONESHOT_MAX_BYTES; rows not a multiple of any block
CASES = ((128, 512, 8192, False, "sum"), (8, 4096, 4096, False, "sum"), (37, 136, 1000, True, "sum"),
         (100, 256, 512, False, "avg"))


def _ref(a, b, bias, reduce_op, group):
    ref = _all_reduce_ref(a.float() @ b.float() + (bias.float() if bias is not None else 0), group)
    return ref / group.size() if reduce_op == "avg" else ref


def _poison():
    """Fill the caching allocator's free blocks with NaN, so that an eager output a call never stored shows."""
    junk = torch.full((16 << 20,), float("nan"), device="cuda")
    del junk


def oneshot_worker(rank: int, ws: int, device: str, form: str):
    import torch.distributed as dist

    _setup_rank(rank, device)
    from overlap_backend.spec import knobs

    knobs.symm.set(ONESHOT_SUM=form, CAPTURE_ON_SYMM=True)
    group = dist.group.WORLD
    gn = group.group_name
    bad, worst = [], 0.0
    before = _paths()
    for dtype in (torch.bfloat16, torch.float32):
        for M, K, N, with_bias, op in CASES:
            assert M * N * dtype.itemsize <= knobs.symm.ONESHOT_MAX_BYTES
            label = f"{M}x{K}x{N} {dtype} bias={with_bias} {op}"
            a = _randn(M, K, dtype=dtype, device=device)
            b = _randn(K, N, dtype=dtype, device=device, scale=K**-0.5)
            bias = _randn(N, dtype=dtype, device=device) if with_bias else None
            for i in range(6):  # the same tensors refilled: from the third call on, private graphs replay
                a.copy_(torch.randn(a.shape, device=device).to(dtype))
                _poison()
                out = torch.ops.overlap.mm_ar(a, b, bias, op, gn, "symm")
                err = _rel_err(out, _ref(a, b, bias, op, group))
                worst = max(worst, err)
                if not err <= _tol(dtype):
                    bad.append(f"rank {rank}: eager call {i} {label}: rel err {err:.3e}")
                del out
            for i in range(3):  # new tensors every call
                a2 = _randn(M, K, dtype=dtype, device=device)
                _poison()
                out = torch.ops.overlap.mm_ar(a2, b, bias, op, gn, "symm")
                err = _rel_err(out, _ref(a2, b, bias, op, group))
                worst = max(worst, err)
                if not err <= _tol(dtype):
                    bad.append(f"rank {rank}: eager call on new inputs {i} {label}: rel err {err:.3e}")
    eager = {k: v - before.get(k, 0) for k, v in _paths().items() if v != before.get(k, 0)}
    torch_calls = eager.get("mm_ar:oneshot:torch", 0)
    if form == "torch" and torch_calls != eager.get("mm_ar:oneshot", -1):
        bad.append(f"rank {rank}: not every one-shot call summed with torch: {eager}")
    if form == "triton" and torch_calls:
        bad.append(f"rank {rank}: a one-shot call summed with torch under ONESHOT_SUM=triton: {eager}")
    if any(k.endswith(":p2p") for k in eager):
        bad.append(f"rank {rank}: calls went to p2p: {eager}")

    # captured: one graph of three one-shot calls (bf16), replayed on fresh inputs with poisoned outputs
    dtype = torch.bfloat16
    ins = [(_randn(M, K, dtype=dtype, device=device), _randn(K, N, dtype=dtype, device=device, scale=K**-0.5),
            _randn(N, dtype=dtype, device=device) if with_bias else None, op) for M, K, N, with_bias, op in CASES[:3]]

    def ops():
        return [torch.ops.overlap.mm_ar(a, b, bias, op, gn, "symm") for a, b, bias, op in ins]

    def check(outs, label):
        nonlocal worst
        for (a, b, bias, op), out in zip(ins, outs):
            err = _rel_err(out, _ref(a, b, bias, op, group))
            worst = max(worst, err)
            if not err <= _tol(dtype):
                bad.append(f"rank {rank}: {label} {tuple(a.shape)}: rel err {err:.3e}")

    for i in range(2):
        check(ops(), f"warm-up {i}")
    torch.cuda.synchronize()
    before = _paths()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = ops()
    captured = {k: v - before.get(k, 0) for k, v in _paths().items() if v != before.get(k, 0)}
    if any(k.endswith(":p2p") for k in captured) or captured.get("mm_ar:oneshot") != len(ins):
        bad.append(f"rank {rank}: captured calls: {captured}")
    if (captured.get("mm_ar:oneshot:torch", 0) == len(ins)) != (form == "torch"):
        bad.append(f"rank {rank}: captured calls took the other form: {captured}")
    for i in range(8):
        for a, _, _, _ in ins:
            a.copy_(torch.randn(a.shape, device=device).to(dtype))
        for t in static:
            t.fill_(float("nan"))
        graph.replay()
        check(static, f"replay {i}")
        if i % 3 == 1:
            check(ops(), f"eager call after replay {i}")
    torch.cuda.synchronize()
    del graph

    # a generated epilogue (residual add) keeps the kernel under "torch" too
    a = _randn(64, 256, dtype=dtype, device=device)
    b = _randn(256, 512, dtype=dtype, device=device, scale=256**-0.5)
    residual = _randn(64, 512, dtype=dtype, device=device)
    before = _paths()
    out = torch.ops.overlap.mm_ar(a, b, None, "sum", gn, "symm", "add:0", [residual])
    took = {k: v - before.get(k, 0) for k, v in _paths().items() if v != before.get(k, 0)}
    err = _rel_err(out, _all_reduce_ref(a.float() @ b.float(), group) + residual.float())
    if not err <= _tol(dtype) or took.get("mm_ar:oneshot:torch"):
        bad.append(f"rank {rank}: one-shot with an epilogue: rel err {err:.3e}, paths {took}")
    assert not bad, "\n".join(bad)
    return f"{form}: eager {eager}; captured {captured}; max rel err {worst:.1e}"


@FORMS
@WORLD_SIZES
@pytest.mark.timeout(300)
def test_mm_ar_oneshot_sum_forms(ws, form):
    _need_gpus(ws)
    print(_run(oneshot_worker, ws, form, timeout=280))
