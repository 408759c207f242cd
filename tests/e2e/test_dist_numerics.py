"""Compiled vs eager on real gloo ranks (2 and 4), forward and backward.

Models as users write them: functional collectives (sequence-parallel block), in-place
``torch.distributed`` calls, and DTensor ``parallelize_module`` (Colwise/Rowwise/SequenceParallel).
Each rank also returns its match reports: every rank must make the same rewrite decisions.
"""

import pytest

from dist_harness import run_batch

FP32_TOL = 1e-4


def _rel(a, b):
    import torch

    a, b = a.detach().double(), b.detach().double()
    if torch.isnan(a).any() or torch.isnan(b).any():
        return float("nan")
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _funcol_sp_block(rank, ws):
    import torch

    from overlap_backend.models import TPBlock

    block = TPBlock(hidden=32, heads=4, ffn=64, group=None, dtype=torch.float32, device="cpu", seed=0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4 * ws, 32, generator=g).chunk(ws, dim=1)[rank].contiguous()
    return block, (x,)


def _dtensor(sequence_parallel):
    def build(rank, ws):
        import torch
        from torch.distributed.device_mesh import init_device_mesh

        from overlap_backend.models import build_dtensor_block

        mesh = init_device_mesh("cpu", (ws,))
        block = build_dtensor_block(hidden=32, ffn=64, mesh=mesh, sequence_parallel=sequence_parallel)
        g = torch.Generator().manual_seed(2)
        x = torch.randn(2, 4 * ws, 32, generator=g)
        if sequence_parallel:
            x = x.chunk(ws, dim=1)[rank].contiguous()
        return block, (x,)

    return build


MODELS = {
    "funcol_sp_block": _funcol_sp_block,
    "dtensor_tp": _dtensor(False),
    "dtensor_tp_sp": _dtensor(True),
}


def _train_step(model, inputs):
    import torch

    inputs = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = model(*inputs)
    out = out.to_local() if hasattr(out, "to_local") else out
    probe = torch.cos(torch.arange(out.numel(), dtype=out.dtype)).view(out.shape)  # non-uniform grad
    (out * probe).sum().backward()
    grads = [x.grad for x in inputs] + [
        (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad) for p in model.parameters()
    ]
    return out, grads


def numerics_worker(rank, ws, names):
    import torch

    import overlap_backend

    results = {}
    for name in names:
        torch._dynamo.reset()
        # Built twice from the same seeds (a model holding a process group cannot be deep-copied).
        model, inputs = MODELS[name](rank, ws)
        compiled_model, _ = MODELS[name](rank, ws)
        ref_out, ref_grads = _train_step(model, inputs)
        backend = overlap_backend.make_backend()
        out, grads = _train_step(torch.compile(compiled_model, backend=backend), inputs)
        errs = [_rel(out, ref_out)] + [_rel(g, r) for g, r in zip(grads, ref_grads)]
        decisions = [
            (r.kind, m.pass_name, m.applied, m.reason) for r in backend.reports for m in r.matches
        ]
        results[name] = {"errs": errs, "decisions": decisions}
    return results


def inplace_inference_worker(rank, ws):
    """``dist.all_reduce`` / ``dist.all_gather_into_tensor`` / ``dist.reduce_scatter_tensor`` in place."""
    import torch
    import torch.distributed as dist

    import overlap_backend

    g = torch.Generator().manual_seed(3)
    w1 = torch.randn(16, 32 * ws, generator=g).chunk(ws, dim=1)[rank]
    w2 = torch.randn(32 * ws, 16, generator=g).chunk(ws, dim=0)[rank]
    x = torch.randn(6 * ws, 16, generator=g)
    shard = x.chunk(ws)[rank].contiguous()

    def mlp(x):
        y = torch.nn.functional.gelu(x @ w1) @ w2
        dist.all_reduce(y)
        return y

    def sp_mlp(shard):
        full = torch.empty(6 * ws, 16)
        dist.all_gather_into_tensor(full, shard)
        h = torch.nn.functional.gelu(full @ w1) @ w2
        out = torch.empty(6, 16)
        dist.reduce_scatter_tensor(out, h)
        return out

    results = {}
    with torch.no_grad():
        for name, fn, arg in (("inplace_all_reduce", mlp, x), ("inplace_gather_scatter", sp_mlp, shard)):
            torch._dynamo.reset()
            ref = fn(arg.clone())
            backend = overlap_backend.make_backend()
            got = torch.compile(fn, backend=backend)(arg.clone())
            results[name] = {
                "errs": [_rel(got, ref)],
                "decisions": [(r.kind, m.pass_name, m.applied, m.reason) for r in backend.reports for m in r.matches],
            }
    return results


def _check(per_rank, expected_applied):
    for name, res in per_rank[0].items():
        for rank, r in enumerate(per_rank):
            errs = r[name]["errs"]
            assert all(e <= FP32_TOL for e in errs), f"{name} rank {rank}: rel errors {errs}"
            # identical decisions on every rank (no deadlock by construction)
            assert r[name]["decisions"] == res["decisions"], f"{name}: rank {rank} decided differently"
        applied = {(kind, p) for kind, p, ok, _ in res["decisions"] if ok}
        missing = expected_applied[name] - applied
        assert not missing, f"{name}: expected rewrites {missing} not applied; decisions: {res['decisions']}"


EXPECTED = {
    "funcol_sp_block": {("forward", "ag_mm"), ("forward", "mm_rs"), ("backward", "mm_rs")},
    "dtensor_tp": {("forward", "mm_ar")},
    "dtensor_tp_sp": {("forward", "ag_mm"), ("forward", "mm_rs"), ("backward", "mm_rs")},
    "inplace_all_reduce": {("inference", "mm_ar")},
    "inplace_gather_scatter": {("inference", "ag_mm"), ("inference", "mm_rs")},
}


_RUNS: dict[int, dict] = {}


def _runs(ws: int) -> dict:
    """Both workers at ``ws`` ranks, in one process group per world size (one start of the ranks)."""
    if ws not in _RUNS:
        _RUNS[ws] = run_batch({"training": (numerics_worker, (list(MODELS),)), "inplace": (inplace_inference_worker, ())},
                              ws, timeout=1200)
    return _RUNS[ws]


@pytest.mark.timeout(1300)
@pytest.mark.parametrize("ws", [2, 4])
def test_training_models_match_eager(ws):
    _check(_runs(ws)["training"].get(), EXPECTED)


@pytest.mark.timeout(1300)
@pytest.mark.parametrize("ws", [2, 4])
def test_inplace_c10d_inference_matches_eager(ws):
    _check(_runs(ws)["inplace"].get(), EXPECTED)
