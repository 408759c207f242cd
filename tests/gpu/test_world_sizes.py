"""CPU checks that the GPU tests' cases are valid at 2, 4 and 8 GPUs.

The GPU tests (tests/gpu/test_gpu*.py) only run on the device machine. What can be checked here: the
sizes each case builds at a world size, against the preconditions under which the ``symm`` lowering
runs an op on its kernels (the cases that must take the kernels do, at every world size, and the
fallback cases fall back), and the models the compiled tests build. Nothing runs on a GPU.
"""

from __future__ import annotations

import math

import pytest
import torch

from test_bench_cli import _cta_symm_problem, _Meta

WORLD_SIZES = (2, 4, 8)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _ag_mm_takes(ws, dtype, lead, k, ns, dim, with_bias, return_gathered=True) -> bool:
    from overlap_backend.runtime.symm.ag_mm import ag_mm_problem

    shard = _Meta(*lead, k, dtype=dtype)
    d = dim % shard.dim()
    K = k * ws if d == shard.dim() - 1 else k
    weights = [_Meta(K, n, dtype=dtype) for n in ns]
    biases = [_Meta(n, dtype=dtype) if with_bias and i == 0 else None for i, n in enumerate(ns)]
    return ag_mm_problem(shard, weights, biases, dim) is None


def _mm_rs_takes(ws, dtype, lead, k, n, dim, with_bias, reduce_op="sum") -> bool:
    """runtime.symm.mm_rs.mm_rs's decision, step by step (the lowering inlines it)."""
    from overlap_backend.codegen import configs
    from overlap_backend.runtime.symm.mm_rs import mm_problem

    out_shape = [*lead, n]
    a, b = _Meta(math.prod(lead), k, dtype=dtype), _Meta(k, n, dtype=dtype)
    if mm_problem(a, b, _Meta(n, dtype=dtype) if with_bias else None, reduce_op) is not None:
        return False
    d = dim % len(out_shape)
    if d == len(out_shape) - 1:
        return False
    run = out_shape[d] // ws * math.prod(out_shape[d + 1 : -1])
    outer = math.prod(out_shape[:d])
    return bool(configs.candidates(dtype, None if outer == 1 else run))


def _mm_ar_takes(ws, dtype, m, k, n, with_bias, reduce_op="sum") -> bool:
    from overlap_backend.runtime.symm.mm_rs import mm_problem

    bias = _Meta(n, dtype=dtype) if with_bias else None
    return mm_problem(_Meta(m, k, dtype=dtype), _Meta(k, n, dtype=dtype), bias, reduce_op) is None


@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_gpu_symm_cases_take_the_kernels_at_every_world_size(ws):
    import test_gpu

    takes = {"_case_ag_mm": _ag_mm_takes, "_case_mm_rs": _mm_rs_takes, "_case_mm_ar": _mm_ar_takes}
    cases = test_gpu._symm_cases(ws)
    for dtype in DTYPES:
        got = [takes[fn.__name__](ws, dtype, **kw) for _, fn, kw in cases]
        on = test_gpu.SYMM_CASES_ON_KERNELS
        assert got[:on] == [True] * on, (ws, dtype, [label for (label, _, _), g in zip(cases, got) if not g])
        assert not any(got[on:]), (ws, dtype, [label for (label, _, _), g in zip(cases, got) if g])


def test_gpu_mm_ar_rows_at_8_leave_a_short_last_chunk():
    """At 8 GPUs the 2100-row mm_ar cases (rounds path) get chunks of 263 rows, the last one 259:
    a case 2 and 4 GPUs never see (2 rounds x 2 x 525, 1 round x 4 x 525)."""
    from overlap_backend.runtime.symm.mm_ar import ar_rounds
    from overlap_backend.spec import knobs

    for ws in WORLD_SIZES:
        m, n = 2100, 1032
        assert m * n * 2 > knobs.symm.ONESHOT_MAX_BYTES  # not one-shot, even in bf16
        rounds = ar_rounds(m, ws)
        rows = -(-m // (rounds * ws))
        assert rounds * ws * rows - m == {2: 0, 4: 0, 8: 4}[ws], (ws, rounds, rows)  # ws=2: 2 rounds of 525


@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_gpu_cta_cases_take_the_kernels_at_every_world_size(ws):
    import test_gpu_cta

    from overlap_backend.runtime import cta_plan, cta_symm
    from overlap_backend.spec import knobs, symm_layout

    for M, H, F, N, act, _, _, dtype in test_gpu_cta.CASES + [(300, 512, 2048, 512, "swiglu", "none", True,
                                                               torch.bfloat16)]:  # + the repeated-calls MLP
        assert F % ws == 0
        assert _cta_symm_problem(cta_symm, symm_layout, M, H, F, N, act, ws, [knobs.cta.K_CHUNKS], dtype=dtype) is None, \
            (ws, M, H, F, N, act, dtype)
    # the stage-1 share of the first GEMM is exercised at every tp (4 at 8 GPUs: by the F=5120 case)
    tp = ws // 2
    assert any(cta_plan.stage1_share(F, tp, True) > 0 for _, _, F, _, act, _, _, _ in test_gpu_cta.CASES
               if act == "swiglu")


def test_gpu_epilogue_block_sizes():
    """The compiled-block test's TP block: heads split over the ranks, 16-byte rows of each rank's Q
    columns; the sizes used up to 4 GPUs (4 heads) cannot be built on 8."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import test_gpu_epilogues

    from overlap_backend.models import TPBlock

    for ws in WORLD_SIZES:
        hidden, heads, ffn = test_gpu_epilogues._block_sizes(ws)
        assert heads % ws == 0 and ffn % ws == 0 and hidden % heads == 0
        assert (heads // ws * (hidden // heads) * 2) % 16 == 0 and (ffn // ws * 2) % 16 == 0
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        TPBlock(*test_gpu_epilogues._block_sizes(8), dtype=torch.float32, device="cpu")
        with pytest.raises(ValueError, match="divisible by the world size 8"):
            TPBlock(96, 4, 192, dtype=torch.float32, device="cpu")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_gpu_moe_routing(ws):
    """The MoE op test's routing tables at each world size (a CPU function of the test): every rank
    sends its rows, each destination gets an expert per received row, and in the skewed cases rank s
    sends nothing to rank s+1 from 3 ranks on (rank pairs that exchange nothing)."""
    import test_gpu_moe

    for case, (rows, h, _, experts, kind) in test_gpu_moe.CASES.items():
        assert (h * 2) % 16 == 0  # token rows of 16 bytes (TMA) in bf16
        counts, experts_of = test_gpu_moe._routing(case, ws, experts, torch.Generator().manual_seed(0))
        assert counts.shape == (ws, ws) and counts.sum(1).tolist() == [rows] * ws, case
        for d in range(ws):
            e = experts_of[d]
            assert e.numel() == int(counts[:, d].sum()) and (e.numel() == 0 or 0 <= int(e.min()) <= int(e.max()) < experts)
        if kind == "skewed" and ws > 2:
            assert all(counts[s, (s + 1) % ws] == 0 for s in range(ws)), case


def test_every_gpu_test_file_runs_at_8():
    """Every WORLD_SIZES parametrization of the GPU tests includes ws8."""
    import importlib

    for name in ("test_gpu", "test_gpu_cta", "test_gpu_moe", "test_gpu_epilogues"):
        mark = importlib.import_module(name).WORLD_SIZES.mark
        assert mark.args[1] == [2, 4, 8] and mark.kwargs["ids"] == ["ws2", "ws4", "ws8"], name
