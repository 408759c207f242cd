"""Regression guard of the host path of a steady-state ``symm`` op call (CPU, fake driver).

The real ``torch.ops.overlap`` ops and ``runtime/symm`` lowerings run on CPU tensors against a group state
whose driver calls (``runtime/cuda.py``) and kernel launches (``codegen/launcher.py``) only count. A
steady-state call (a shape seen before) must cost what its schedule needs and no more: these tests bound
its driver calls, kernel launches, cuBLAS calls, tensor allocations and Python function calls, and check
that the argument checks ran only on the first call of the key. The bounds are today's counts plus a
little (the Python count includes this harness' ~20 counting wrappers): a change that adds per-call work
fails here and has to say why.
"""

from __future__ import annotations

import sys
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from overlap_backend.codegen import launcher
from overlap_backend.runtime import checks, cuda as _cuda, ops
from overlap_backend.runtime.symm import ag_mm as symm_ag_mm
from overlap_backend.runtime.symm import group as symm_group
from overlap_backend.runtime.symm import lowering_helpers
from overlap_backend.runtime.symm import mm_ar as symm_mm_ar
from overlap_backend.runtime.symm import mm_rs as symm_mm_rs
from overlap_backend.spec import knobs

WS = 2
DRIVER = ("write_value32", "wait_value32", "memcpy_async", "join", "wait_event", "run_memops")


class _Stream:
    cuda_stream = 0

    def __init__(self, counts):
        self.counts = counts

    def wait_stream(self, other):
        self.counts["wait_stream"] += 1


@pytest.fixture(scope="module")
def group():
    made = not dist.is_initialized()
    if made:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD.group_name
    if made:  # later tests of this process start their own
        dist.destroy_process_group()


@pytest.fixture
def fake(group, monkeypatch):
    """(counts, state): the symm lowerings of this process run on a fake 2-rank state (this process is
    rank 0) whose driver calls and launches are counted."""
    counts: Counter = Counter()

    def counter(name):
        def call(*args, **kwargs):
            counts[name] += 1
        return call

    for name in DRIVER:
        monkeypatch.setattr(_cuda, name, counter(name))
    st = symm_group.GroupState.host_only(0, WS, group)
    st.fast, st._join_events = True, [1, 2, 3]
    st.flags = SimpleNamespace(ptrs=[p << 24 for p in range(WS)], local=0)
    st.data = SimpleNamespace(ptrs=[p << 32 for p in range(WS)], nbytes=1 << 30)
    st.push_stream, st.copy_stream = _Stream(counts), _Stream(counts)
    st.device, st._watch_progress = SimpleNamespace(index=0), True
    st.num_sms, st.status_ptr, st._status_arg = 132, 1 << 40, (0, 0)
    backing = torch.empty(1 << 24, dtype=torch.int8)

    def data_view(dtype, shape, offset_bytes=0):
        n = torch.Size(shape).numel() * dtype.itemsize
        return backing[offset_bytes:offset_bytes + n].view(dtype).view(shape)

    monkeypatch.setattr(st, "data_view", data_view, raising=False)
    monkeypatch.setattr(st, "ensure_data", lambda nbytes, op="": None, raising=False)
    compute = _Stream(counts)
    monkeypatch.setattr(_cuda, "current_stream", lambda index: compute)
    for module in (symm_ag_mm, symm_mm_rs, symm_mm_ar):
        monkeypatch.setattr(module, "call_state", lambda group_name, device, graph: (st, None))
    monkeypatch.setattr(symm_ag_mm, "ag_mm_problem", lambda *a: None)
    monkeypatch.setattr(symm_mm_rs, "mm_problem", lambda *a: None)
    monkeypatch.setattr(symm_mm_ar, "mm_problem", lambda *a: None)
    monkeypatch.setattr(symm_mm_rs, "group_size", lambda name: WS)

    def launch(kernel, grid, *args, **kwargs):
        if not getattr(launcher._state, "preload", False):
            counts["launch"] += 1

    monkeypatch.setattr(launcher, "launch", launch)
    for fn in ("mm", "addmm", "sum"):
        real = getattr(torch, fn)
        monkeypatch.setattr(torch, fn, lambda *a, _real=real, _fn=fn, **k: (counts.update([f"torch.{_fn}"]),
                                                                                 _real(*a, **k))[1])
    yield counts, st
    symm_ag_mm._plans.clear()
    symm_mm_rs._plans.clear()
    checks.CHECKED.clear()


class _Allocations(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.empty, torch.ops.aten.new_empty, torch.ops.aten.empty_strided,
                                   torch.ops.aten.empty_like, torch.ops.aten.zeros):
            self.count += 1
        return func(*args, **(kwargs or {}))


def steady_state(call, python_fn, counts):
    """What one steady-state ``call()`` costs: {driver call kind / launch / torch op: count, "python
    calls": Python functions entered, "allocations": tensors allocated (of ``python_fn()``, the same call
    made from Python below the dispatcher)}."""
    for _ in range(3):
        call()
    counts.clear()
    entered = [0]

    def prof(frame, event, arg):
        if event == "call":
            entered[0] += 1

    sys.setprofile(prof)
    try:
        call()
    finally:
        sys.setprofile(None)
    out = dict(counts)
    out["python calls"] = entered[0]
    with _Allocations() as mode:
        python_fn()
    out["allocations"] = mode.count
    return out


def within(measured: dict, bounds: dict):
    over = {k: (measured.get(k, 0), v) for k, v in bounds.items() if measured.get(k, 0) > v}
    assert not over, f"steady-state call costs more than its bound (measured, bound): {over}; all: {measured}"
    unexpected = set(measured) - set(bounds)
    assert not unexpected, f"per-call work with no bound: {unexpected}; all: {measured}"


def test_ag_mm_cublas_steady_state(fake, group):
    counts, _ = fake
    shard, w = torch.randn(256, 64), torch.randn(64, 96)
    args = (shard, [w], [None], 0, group, "symm", False)
    with knobs.symm.patch(AG_MM_GEMM="cublas", AG_CUBLAS_MIN_N=0):
        got = steady_state(lambda: torch.ops.overlap.ag_mm(*args), lambda: ops.ag_mm(*args), counts)
        assert torch.ops.overlap.ag_mm(*args)[1][0][:256].allclose(shard @ w, atol=1e-5)
    # begin: one batch (STARTED, READY) + a join of the push stream; push: READY wait, copy, flag;
    # compute: the peer chunk's flag; end: a join and one batch (PEER_OK, FINISHED); the copy stream is not used
    within(got, {"run_memops": 2, "join": 2, "wait_value32": 2, "memcpy_async": 1,
                 "write_value32": 1, "torch.mm": 2, "python calls": 95, "allocations": 2})


def test_ag_mm_kernel_steady_state(fake, group):
    counts, st = fake
    shard, w = torch.randn(512, 64), torch.randn(64, 128)
    args = (shard, [w], [None], 0, group, "symm", False)
    with knobs.symm.patch(AG_MM_GEMM="triton"):
        key = symm_ag_mm.ag_mm_plan(st, shard, [w], (), 0, False)[1][0]
        lowering_helpers.tuned_configs[("ag_mm", key)] = (128, 128, 64, 8, 3, 8, False)
        got = steady_state(lambda: torch.ops.overlap.ag_mm(*args), lambda: ops.ag_mm(*args), counts)
    within(got, {"run_memops": 2, "join": 2, "wait_value32": 1, "memcpy_async": 1,
                 "write_value32": 1, "launch": 1, "python calls": 100, "allocations": 2})


def test_ag_mm_plan_runs_the_epilogue_apart_where_that_measured_faster(fake, ratios):
    """ag_mm on its kernel: a generated epilogue fused into the tiles, or where the ratio file measured the kernel
    plain with the epilogue after it faster (``apart_ratio``), no generated epilogue and the spec run after it."""
    from ratio_files import entry

    _, st = fake
    shard, w = torch.randn(512, 64), torch.randn(64, 128)
    fused = {**entry("ag_mm", 2, 1024, 64, 128, 1.10, fused=True, dtype="float32"), "apart_ratio": 1.08}
    with knobs.symm.patch(AG_MM_GEMM="triton"):
        for apart, want_post in ((1.02, ["gelu"]), (1.095, None)):
            ratios({**fused, "apart_ratio": apart})
            symm_ag_mm._plans.clear()
            gemm, _, gens, dtypes, post, *_ = symm_ag_mm.ag_mm_plan(st, shard, [w], ("gelu",), 0, False)
            assert gemm == "triton" and post == want_post and dtypes == [shard.dtype]
            assert (gens[0] is None) == (want_post is not None)
    symm_ag_mm._plans.clear()


def test_ag_mm_fused_gemm_tunes_apart_from_the_plain_one(fake):
    """The tile-config key of a GEMM with a fused epilogue differs from the plain GEMM's of the same shape (their
    candidates and best configs can differ); an epilogue run apart leaves the GEMM plain, with the plain key."""
    _, st = fake
    shard, w = torch.randn(512, 64), torch.randn(64, 128)
    with knobs.symm.patch(AG_MM_GEMM="triton"):
        symm_ag_mm._plans.clear()
        plain = symm_ag_mm.ag_mm_plan(st, shard, [w], (), 0, False)[1][0]
        fused = symm_ag_mm.ag_mm_plan(st, shard, [w], ("gelu",), 0, False)[1][0]
    symm_ag_mm._plans.clear()
    assert plain != fused and plain[:-1] == fused[:-1]


def test_mm_rs_cublas_steady_state(fake, group):
    counts, _ = fake
    a, b = torch.randn(512, 64), torch.randn(64, 96)
    args = (a, b, None, [512, 96], 0, "sum", group, "symm")
    with knobs.symm.patch(MM_RS_GEMM="cublas", RS_CUBLAS_MIN_K=0, BAND_ROWS_MIN=16):
        got = steady_state(lambda: torch.ops.overlap.mm_rs(*args), lambda: ops.mm_rs(*args), counts)
        ref = a @ b
        assert torch.ops.overlap.mm_rs(*args).shape == (256, 96) and ref.shape == (512, 96)
    within(got, {"run_memops": 2, "join": 2, "wait_value32": 3, "memcpy_async": 1,
                 "write_value32": 2, "torch.mm": 2, "torch.sum": 1, "python calls": 90, "allocations": 2})


def test_mm_ar_oneshot_steady_state(fake, group):
    counts, _ = fake
    a, b = torch.randn(64, 64), torch.randn(64, 96)
    args = (a, b, None, "sum", group, "symm")
    got = steady_state(lambda: torch.ops.overlap.mm_ar(*args), lambda: ops.mm_ar(*args), counts)
    within(got, {"run_memops": 2, "join": 2, "wait_value32": 1, "memcpy_async": 1,
                 "write_value32": 1, "torch.mm": 1, "launch": 1, "python calls": 90, "allocations": 1})


def test_mm_ar_oneshot_summed_by_torch_steady_state(fake, group):
    """knobs.symm.ONESHOT_SUM="torch": the kernel launch becomes one stream wait per peer and one torch.sum."""
    counts, _ = fake
    a, b = torch.randn(64, 64), torch.randn(64, 96)
    args = (a, b, None, "sum", group, "symm")
    with knobs.symm.patch(ONESHOT_SUM="torch"):
        before = lowering_helpers.PATHS["mm_ar:oneshot:torch"]
        got = steady_state(lambda: torch.ops.overlap.mm_ar(*args), lambda: ops.mm_ar(*args), counts)
        assert lowering_helpers.PATHS["mm_ar:oneshot:torch"] > before
    # (stream waits: the peer's READY before the push, as the kernel form; the peer's arrival before the sum)
    assert not got.get("launch") and got.get("wait_value32") == 2 and got.get("torch.sum") == 1, got
    within(got, {"run_memops": 2, "join": 2, "wait_value32": 2, "memcpy_async": 1,
                 "write_value32": 1, "torch.mm": 1, "torch.sum": 1, "python calls": 90, "allocations": 1})


def test_checks_run_on_the_first_call_of_a_key_only(fake, group, monkeypatch):
    counts, _ = fake
    ran = Counter()
    real = checks.check_mm_ar

    def counted(*a, **k):
        ran["check"] += 1
        return real(*a, **k)

    monkeypatch.setattr(checks, "check_mm_ar", counted)
    a, b = torch.randn(64, 64), torch.randn(64, 96)
    for _ in range(3):
        torch.ops.overlap.mm_ar(a, b, None, "sum", group, "symm")
    assert ran["check"] == 1
    torch.ops.overlap.mm_ar(torch.randn(32, 64), b, None, "sum", group, "symm")  # a new key is checked
    assert ran["check"] == 2
    with pytest.raises(ops.OverlapInputError):  # and a bad input still raises, before any driver call
        counts.clear()
        torch.ops.overlap.mm_ar(a, torch.randn(32, 96), None, "sum", group, "symm")
    assert not any(counts[k] for k in DRIVER)


def test_ag_mm_decode_copies_the_own_shard_once_per_call(fake, group, monkeypatch):
    """Chunks short enough for the whole-input kernel (``knobs.codegen.AG_MM_WHOLE_ROWS``): the own shard goes into
    its slot of the receive buffer once per call, by the first weight's launch, not once per weight."""
    from overlap_backend.codegen import ag_mm as ag_kernel

    _, st = fake
    shard, ws_ = torch.randn(32, 64), [torch.randn(64, 128), torch.randn(64, 96)]
    assert ag_kernel.reads_whole(shard.shape[0])
    seen, real = [], ag_kernel.launch
    monkeypatch.setattr(ag_kernel, "launch", lambda *a, **kw: (seen.append(kw["shard_in_buf"]), real(*a, **kw))[1])
    with knobs.symm.patch(AG_MM_GEMM="triton"):
        for key in symm_ag_mm.ag_mm_plan(st, shard, ws_, (), 0, False)[1]:
            lowering_helpers.tuned_configs[("ag_mm", key)] = (64, 128, 64, 8, 3, 8, False)
        torch.ops.overlap.ag_mm(shard, ws_, [None, None], 0, group, "symm", False)
    assert seen[-2:] == [False, True]


def test_mm_rs_plans_name_the_tma_variants_only_where_they_apply(monkeypatch):
    """With peer stores on, a captured call (copy engine) tunes over the TMA variants and an eager call (peer stores,
    where they do not apply) must not: their plans, and so their tuning keys, tell the two apart, or the eager call
    would reuse the captured call's TMA config."""
    monkeypatch.setattr(symm_mm_rs, "group_size", lambda name: WS)
    monkeypatch.setattr(symm_mm_rs, "mm_problem", lambda *a: None)
    monkeypatch.setattr(symm_mm_rs, "capture_problem", lambda a: None)
    monkeypatch.setattr(symm_mm_rs, "rs_gemm", lambda *a, **k: "triton")
    a, b = torch.randn(WS * 256, 64, dtype=torch.bfloat16), torch.randn(64, 128, dtype=torch.bfloat16)
    symm_mm_rs._plans.clear()
    try:
        with knobs.symm.patch(TRANSPORT="peer", RS_TMA="on"):
            captured = symm_mm_rs.mm_rs_plan(a, b, None, [WS * 256, 128], 0, "sum", "g", True)
            eager = symm_mm_rs.mm_rs_plan(a, b, None, [WS * 256, 128], 0, "sum", "g", False)
    finally:
        symm_mm_rs._plans.clear()
    assert captured[0] is None and eager[0] is None
    assert any(c[6] for c in captured[6]) and captured[7] == "on"
    assert not any(c[6] for c in eager[6]) and eager[7] == "off"
