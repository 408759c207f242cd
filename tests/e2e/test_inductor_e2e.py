"""Inductor end to end (the pass runs as Inductor's post-grad custom pass), 2 gloo ranks.

Slow on the CPU machine (Inductor's C++ codegen takes ~25 s per graph), so there are few of these.
"""

import pytest

from dist_harness import run_ranks


def sp_mlp_worker(rank, ws):
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    import torch.nn.functional as F

    import overlap_backend  # noqa: F401  registers backend="overlap"

    all_gather = getattr(funcol, "all_gather_single", funcol.all_gather_tensor)
    reduce_scatter = getattr(funcol, "reduce_scatter_single", funcol.reduce_scatter_tensor)
    group = dist.group.WORLD
    g = torch.Generator().manual_seed(0)
    w1 = torch.randn(64 * ws, 32, generator=g).chunk(ws)[rank].contiguous().requires_grad_()
    b1 = torch.randn(64 * ws, generator=g).chunk(ws)[rank].contiguous().requires_grad_()
    w2 = torch.randn(32, 64 * ws, generator=g).chunk(ws, dim=1)[rank].contiguous().requires_grad_()
    x = torch.randn(2, 8 * ws, 32, generator=g).chunk(ws, dim=1)[rank].contiguous()

    def block(x):
        h = F.gelu(F.linear(all_gather(x, 1, group), w1, b1))
        return x + reduce_scatter(h @ w2.t(), "sum", 1, group)

    def step(fn):
        for p in (w1, b1, w2):
            p.grad = None
        xi = x.clone().requires_grad_()
        out = fn(xi)
        (out * torch.sin(torch.arange(out.numel(), dtype=out.dtype).view(out.shape))).sum().backward()
        return [out.detach(), xi.grad, w1.grad, b1.grad, w2.grad]

    ref = step(block)
    got = step(torch.compile(block, backend="overlap"))
    errs = [((a - b).norm() / b.norm()).item() for a, b in zip(got, ref)]
    reports = overlap_backend.REPORTS
    decisions = [(r.kind, m.pass_name, m.applied) for r in reports for m in r.matches]
    return errs, decisions


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_inductor_sp_mlp_forward_backward(clean_env):
    per_rank = run_ranks(sp_mlp_worker, 2, timeout=800, env={"OVERLAP_INDUCTOR": "1"})
    for errs, decisions in per_rank:
        assert all(e <= 1e-4 for e in errs), errs
        assert decisions == per_rank[0][1]
        assert ("forward", "ag_mm", True) in decisions
        assert ("forward", "mm_rs", True) in decisions
        assert ("backward", "mm_rs", True) in decisions
