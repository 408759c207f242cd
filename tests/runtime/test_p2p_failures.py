"""The p2p lowering on degenerate shapes and under failures, on 2 gloo ranks.

Empty contraction (K = 0) or empty output columns (N = 0) compute what eager computes; an exception
raised inside a ring step (a compute patched to raise) leaves the group usable: the transfers the
step posted are waited on before the error propagates, so a following ``dist.all_reduce`` completes.
A tensor that requires grad in grad mode is refused before any transfer, naming the op and the argument
(the ops have no autograd formula); under ``torch.no_grad`` the same call computes what eager computes.
One spawn of 2 ranks runs every case (spawning costs most of the time).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from dist_harness import run_ranks


class InjectedFailure(RuntimeError):
    """The error a patched compute raises inside a ring step."""


def _group_usable(group):
    """True when an all-reduce on ``group`` completes with the right sum, else what went wrong."""
    import torch
    import torch.distributed as dist

    t = torch.ones(3)
    try:
        work = dist.all_reduce(t, group=group, async_op=True)
        work.wait(timedelta(seconds=10))
    except RuntimeError as e:
        return f"{type(e).__name__}: {e}"
    return torch.equal(t, torch.full((3,), float(group.size()))) or f"wrong sum {t.tolist()}"


def _empty_shapes(rank, ws, group, lowering="p2p"):
    """(case, max abs error vs eager, group usable after) for K = 0 and N = 0 matmuls of every op, called
    with ``lowering`` (``symm`` handles them before its CUDA check, so its empty paths run on the CPU too)."""
    import torch
    import torch.distributed as dist

    name = group.group_name
    ov = torch.ops.overlap
    results = []

    def gather(shard, dim):
        parts = [torch.empty_like(shard) for _ in range(ws)]
        dist.all_gather(parts, shard.contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    def record(case, got, ref):
        err = (got - ref).abs().max().item() if got.numel() else 0.0
        same_shape = list(got.shape) == list(ref.shape)
        results.append((case, same_shape, err, _group_usable(group)))

    g = torch.Generator().manual_seed(rank)
    for gdim, (rows, k, n) in [(0, (4, 0, 6)), (0, (4, 8, 0)), (1, (4, 0, 6)), (1, (4, 4, 0)), (0, (0, 8, 6))]:
        shard = torch.randn(rows, k, generator=g)
        kk = k * (ws if gdim == 1 else 1)
        w = torch.randn(kk, n, generator=torch.Generator().manual_seed(7))
        bias = torch.randn(n, generator=torch.Generator().manual_seed(8))
        for b in (None, bias):
            case = f"ag_mm gather_dim={gdim} shard={[rows, k]} w={[kk, n]} bias={b is not None}"
            try:
                gathered, (out,) = ov.ag_mm(shard, [w], [b], gdim, name, lowering, True)
            except Exception as e:  # noqa: BLE001 - reported to the parent
                results.append((case, False, f"{type(e).__name__}: {e}", _group_usable(group)))
                continue
            full = gather(shard, gdim)
            ref = full.reshape(full.numel() // kk if kk else full.shape[0], kk) @ w + (0 if b is None else b)
            record(case, out, ref)
            record(case + " (gathered)", gathered, full)
    for m, k, n in [(4, 0, 6), (4, 8, 0)]:
        a = torch.randn(m, k, generator=g)
        b = torch.randn(k, n, generator=torch.Generator().manual_seed(9))
        bias = torch.randn(n, generator=g)
        for bb in (None, bias):
            full = a @ b + (0 if bb is None else bb)
            reduced = full.clone()
            dist.all_reduce(reduced, group=group)
            for scatter_dim in (0, 1):
                case = f"mm_rs a={[m, k]} b={[k, n]} scatter_dim={scatter_dim} bias={bb is not None}"
                if n % ws and scatter_dim == 1:
                    continue
                try:
                    got = ov.mm_rs(a, b, bb, [m, n], scatter_dim, "sum", name, lowering)
                except Exception as e:  # noqa: BLE001
                    results.append((case, False, f"{type(e).__name__}: {e}", _group_usable(group)))
                    continue
                record(case, got, reduced.chunk(ws, dim=scatter_dim)[rank] if reduced.numel() else
                       reduced.tensor_split(ws, dim=scatter_dim)[rank])
            case = f"mm_ar a={[m, k]} b={[k, n]} bias={bb is not None}"
            try:
                record(case, ov.mm_ar(a, b, bb, "sum", name, lowering), reduced)
            except Exception as e:  # noqa: BLE001
                results.append((case, False, f"{type(e).__name__}: {e}", _group_usable(group)))
    return results


def _empty_mixed_weights(rank, ws, group):
    """ag_mm on symm with a weight of N = 0 between two others, with and without the gathered tensor and
    epilogues: (case, same shapes, max abs error vs eager, group usable after)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(50 + rank)
    shard = torch.randn(3, 8, generator=g)
    weights = [torch.randn(8, n, generator=torch.Generator().manual_seed(60 + n)) for n in (5, 0, 4)]
    biases = [torch.randn(5, generator=torch.Generator().manual_seed(70)), None, None]
    parts = [torch.empty_like(shard) for _ in range(ws)]
    dist.all_gather(parts, shard, group=group)
    full = torch.cat(parts)
    refs = [full @ w + (0 if b is None else b) for w, b in zip(weights, biases)]
    results = []
    for gathered_too in (True, False):
        for epilogue in ("", "gelu|mul:2.0|silu"):
            case = f"ag_mm symm N=(5, 0, 4) return_gathered={gathered_too} epilogue={epilogue!r}"
            try:
                gathered, outs = torch.ops.overlap.ag_mm(shard, weights, biases, 0, group.group_name, "symm",
                                                         gathered_too, epilogue)
            except Exception as e:  # noqa: BLE001 - reported to the parent
                results.append((case, False, f"{type(e).__name__}: {e}", _group_usable(group)))
                continue
            want = [F.gelu(refs[0]), refs[1] * 2.0, F.silu(refs[2])] if epilogue else refs
            same = [list(o.shape) for o in outs] == [list(r.shape) for r in want]
            same = same and list(gathered.shape) == (list(full.shape) if gathered_too else [0])
            errs = [(o - r).abs().max().item() for o, r in zip(outs, want) if r.numel()]
            if gathered_too:
                errs.append((gathered - full).abs().max().item())
            results.append((case, same, max(errs) if same else float("inf"), _group_usable(group)))
    # K = 0 of ag_mm, N = 0 of mm_rs and mm_ar: computed without a transfer (no lowering path counts a call)
    from overlap_backend.runtime.symm import lowering_helpers

    before = dict(lowering_helpers.PATHS)
    empty_k = torch.randn(3, 0, generator=g)
    gathered, (out,) = torch.ops.overlap.ag_mm(empty_k, [torch.randn(0, 5)], [biases[0]], 0, group.group_name, "symm",
                                               True)
    rs = torch.ops.overlap.mm_rs(torch.randn(2 * ws, 8), weights[1], None, [2 * ws, 0], 0, "sum", group.group_name,
                                 "symm")
    ar = torch.ops.overlap.mm_ar(shard, weights[1], None, "sum", group.group_name, "symm")
    same = (list(gathered.shape) == [3 * ws, 0] and list(rs.shape) == [2, 0] and list(ar.shape) == [3, 0]
            and dict(lowering_helpers.PATHS) == before)
    err = (out - biases[0].expand(3 * ws, 5)).abs().max().item()
    results.append((f"no transfer for ag_mm K=0, mm_rs N=0, mm_ar N=0 (paths {dict(lowering_helpers.PATHS)} vs "
                    f"{before})", same, err, _group_usable(group)))
    return results


def _injected_failures(rank, ws):
    """(case, whether this rank's compute raised, what the op raised, group usable after) per injected failure."""
    import torch
    import torch.distributed as dist

    from overlap_backend.runtime import cta_p2p, moe_p2p, p2p

    ov = torch.ops.overlap
    x, w = torch.randn(4, 8), torch.randn(8, 6)
    a, b = torch.randn(8, 4), torch.randn(4, 6)
    wg, wd = torch.randn(2, 8, 6), torch.randn(2, 6, 8)

    def patched(module, attr, fail_at, failing):
        """``module.attr`` that raises on the ranks ``failing`` at its ``fail_at``-th call (0-based)."""
        original = getattr(module, attr)
        calls = [0]

        def fn(*args, **kwargs):
            calls[0] += 1
            if rank in failing and calls[0] - 1 == fail_at:
                raise InjectedFailure(f"injected into {attr}")
            return original(*args, **kwargs)

        return original, fn

    both, first = (0, 1), (0,)
    cases = [
        # (case, the ranks that raise, module, attribute, its call that raises, the op call); a rank-local
        # failure only where the peer's schedule needs nothing more from the failing rank (2 ranks)
        ("ag_mm step 0", first, p2p, "matmul", 0, lambda: ov.ag_mm(x, [w], [None], 0, name, "p2p", False)),
        ("ag_mm gather last dim", both, p2p, "matmul", 0, lambda: ov.ag_mm(x, [torch.randn(16, 6)], [None], 1, name,
                                                                      "p2p", False)),
        ("mm_rs step 1", first, p2p, "matmul", 1, lambda: ov.mm_rs(a, b, None, [8, 6], 0, "sum", name, "p2p")),
        ("mm_ar step 1", both, p2p, "matmul", 1, lambda: ov.mm_ar(a, b, None, "sum", name, "p2p")),
        ("moe_experts remote rows", both, moe_p2p, "expert_matmul", 0,
         lambda: ov.moe_experts(x, [2, 2], [2, 2], torch.arange(4), None, [2, 2], wg, wg, wd, name, "p2p",
                                [False] * 5)),
        ("cta_pipeline_mlp step 1", both, cta_p2p, "linear", 2,
         lambda: ov.cta_pipeline_mlp(x, torch.randn(8, 6), None, None, None, torch.randn(6, 8), None, "gelu", "none",
                                     2, name, "p2p")),
    ]
    results = []
    for case, failing, module, attr, fail_at, call in cases:
        group = dist.new_group(list(range(ws)))  # one per case: a case that breaks its group spoils no other
        name = group.group_name
        original, fn = patched(module, attr, fail_at, failing)
        setattr(module, attr, fn)
        try:
            try:
                call()
                raised = None
            except Exception as e:  # noqa: BLE001
                raised = f"{type(e).__name__}: {e}"
        finally:
            setattr(module, attr, original)
        results.append((case, rank in failing, raised, _group_usable(group)))
    return results


def _grad_mode(rank, ws, group):
    """Per op and argument that requires grad: (case, what grad mode raised, max abs error of the same call
    under no_grad and of a grad-mode call on detached tensors vs eager, group usable after)."""
    import torch
    import torch.distributed as dist

    name = group.group_name
    ov = torch.ops.overlap
    g = torch.Generator().manual_seed(90 + rank)
    x, w, bias = torch.randn(4, 8, generator=g), torch.randn(8, 6, generator=g), torch.randn(6, generator=g)
    parts = [torch.empty_like(x) for _ in range(ws)]
    dist.all_gather(parts, x, group=group)
    gathered = torch.cat(parts)
    full = x @ w + bias
    summed = full.clone()
    dist.all_reduce(summed, group=group)
    w_experts, w_down = torch.randn(2, 8, 6, generator=g), torch.randn(2, 6, 8, generator=g)
    ag_mm_ref = gathered @ w + bias
    cases = [  # (case, the arguments, which of them requires grad, the op call, eager's result)
        ("ag_mm", {"x": x, "w": w, "b": bias}, "w", "weights[0]",
         lambda t: ov.ag_mm(t["x"], [t["w"]], [t["b"]], 0, name, "p2p", False)[1][0], ag_mm_ref),
        ("ag_mm", {"x": x, "w": w, "b": bias}, "b", "biases[0]",
         lambda t: ov.ag_mm(t["x"], [t["w"]], [t["b"]], 0, name, "p2p", False)[1][0], ag_mm_ref),
        ("mm_rs", {"x": x, "w": w, "b": bias}, "x", "a",
         lambda t: ov.mm_rs(t["x"], t["w"], t["b"], [4, 6], 0, "sum", name, "p2p"), summed.chunk(ws)[rank]),
        ("mm_ar", {"x": x, "w": w, "b": bias}, "b", "bias",
         lambda t: ov.mm_ar(t["x"], t["w"], t["b"], "sum", name, "p2p"), summed),
        ("moe_experts", {"x": x, "wg": w_experts, "wd": w_down}, "wd", "w_down",
         lambda t: ov.moe_experts(t["x"], [2, 2], [2, 2], torch.arange(4), None, [2, 2], t["wg"], t["wg"], t["wd"],
                                  name, "p2p", [False] * 5)[0], None),
    ]
    results = []
    for op, tensors, grad_arg, arg_name, call, ref in cases:
        case = f"{op} with {arg_name} requiring grad"
        needs = {k: (v.clone().requires_grad_() if k == grad_arg else v) for k, v in tensors.items()}
        try:
            call(needs)
            raised = None
        except Exception as e:  # noqa: BLE001 - reported to the parent
            raised = f"{type(e).__name__}: {e}"
        usable = _group_usable(group)
        with torch.no_grad():
            under_no_grad = call(needs)
        detached = call(tensors)
        if ref is None:  # moe_experts: the two ways against each other
            ref = under_no_grad
        errs = [(got - ref).abs().max().item() for got in (under_no_grad, detached)]
        results.append((case, raised, max(errs), usable and _group_usable(group)))
    return results


def failures_worker(rank, ws):
    import os

    import torch.distributed as dist

    import overlap_backend  # noqa: F401  registers torch.ops.overlap

    os.environ["OVERLAP_TIMEOUT_S"] = "10"  # read by the group created next
    group = dist.new_group(list(range(ws)))
    return {"empty": _empty_shapes(rank, ws, group), "empty_symm": _empty_shapes(rank, ws, group, "symm"),
            "empty_symm_mixed": _empty_mixed_weights(rank, ws, group), "grad_mode": _grad_mode(rank, ws, group),
            "injected": _injected_failures(rank, ws)}


@pytest.fixture(scope="module")
def failure_results():
    return run_ranks(failures_worker, 2, timeout=240)


@pytest.mark.timeout(300)
def test_empty_contraction_or_output_columns_compute_what_eager_computes(failure_results):
    for rank, out in enumerate(failure_results):
        for case, same_shape, err, usable in out["empty"]:
            assert same_shape and err == 0.0 or (same_shape and isinstance(err, float) and err < 1e-5), (rank, case, err)
            assert usable is True, (rank, case, usable)


@pytest.mark.timeout(300)
def test_symm_empty_contraction_or_output_columns_compute_what_eager_computes(failure_results):
    for rank, out in enumerate(failure_results):
        for case, same_shape, err, usable in out["empty_symm"] + out["empty_symm_mixed"]:
            assert same_shape and isinstance(err, float) and err < 1e-5, (rank, case, err)
            assert usable is True, (rank, case, usable)


@pytest.mark.timeout(300)
def test_exception_inside_a_ring_step_leaves_the_group_usable(failure_results):
    for rank, out in enumerate(failure_results):
        for case, failed, raised, usable in out["injected"]:
            if failed:
                assert raised is not None and "InjectedFailure" in raised, (rank, case, raised)
            else:
                assert raised is None, (rank, case, raised)
            assert usable is True, (rank, case, usable)


@pytest.mark.timeout(300)
def test_a_tensor_requiring_grad_in_grad_mode_is_refused_before_any_transfer(failure_results):
    for rank, out in enumerate(failure_results):
        for case, raised, err, usable in out["grad_mode"]:
            op, arg = case.split(" with ")[0], case.split(" with ")[1].split(" requiring")[0]
            assert raised is not None and raised.startswith("OverlapInputError"), (rank, case, raised)
            assert f"overlap::{op}: argument {arg!r}: requires grad in grad mode" in raised, (rank, case, raised)
            assert err < 1e-5 and usable is True, (rank, case, err, usable)
