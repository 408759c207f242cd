"""``overlap::moe_tp_experts`` / ``moe_tp_experts_backward`` (p2p token bands) against their semantics
written with plain torch ops and ``dist.all_reduce``, on 2 gloo ranks: the grouped (offsets) and the
per-row (expert_ids) forms, with and without mask, routing weights, un-permutation, rows past the
last offset, several band counts; and an exception in a band waits on the bands already started."""

import pytest

from dist_harness import run_ranks


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _grouped(a, w, offsets, expert_ids):
    import torch

    if expert_ids is not None:
        return torch.einsum("mk,mkn->mn", a, w[expert_ids])
    out = a.new_zeros((a.shape[0], w.shape[2]))
    start = 0
    for e, end in enumerate(offsets.tolist()):
        out[start:end] = a[start:end] @ w[e]
        start = end
    return out


def tp_experts_worker(rank, ws):
    import torch
    import torch.distributed as dist

    import overlap_backend  # noqa: F401  registers torch.ops.overlap
    from overlap_backend.runtime import tp_experts_p2p
    from overlap_backend.spec import knobs

    name = dist.group.WORLD.group_name
    results = []

    def rand(*shape, seed):
        return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))

    def problem(seed, tokens, k, e, kk, n, form, past_end):
        gen = torch.Generator().manual_seed(seed)
        m = tokens * k
        ids = torch.randint(0, e, (m,), generator=gen)  # the same routing on every rank
        sorted_ids, perm = ids.sort()
        counts = torch.bincount(sorted_ids, minlength=e)
        offsets = counts.cumsum(0).to(torch.int32)
        if past_end:  # the last expert's rows are past offsets[-1] (as transformers' EP sentinel rows are)
            offsets[-1] = offsets[-2]
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(m)
        a = rand(ws, m, kk, seed=seed + 1)[rank]  # each rank its own F-slice's activations
        w = rand(ws, e, kk, n, seed=seed + 2)[rank]
        if form == "offsets":
            return a, w, offsets, None, inv, perm // k
        return a, w, None, ids, None, torch.arange(m) // k

    cases = [(tokens, k, form, mask, scale, past_end, bands)
             for tokens, k, bands in ((16, 2, 4), (7, 3, 3), (5, 1, 8), (9, 2, 1))
             for form in ("offsets", "expert_ids")
             for mask, scale, past_end in ((False, True, False), (True, True, True), (False, False, False))]
    for i, (tokens, k, form, use_mask, use_scale, past_end, bands) in enumerate(cases):
        seed = 100 * i
        a, w, offsets, ids, slot_rows, tok = problem(seed, tokens, k, 4, 6, 5, form, past_end)
        m = a.shape[0]
        mask = (torch.rand(m, 1, generator=torch.Generator().manual_seed(seed + 3)) < 0.3) if use_mask else None
        scale = rand(m, 1, seed=seed + 4) if use_scale else None
        with knobs.tp_experts.patch(BANDS=bands):
            out, rows = torch.ops.overlap.moe_tp_experts(a, w, offsets, ids, mask, scale, slot_rows, k, "sum",
                                                         name, "p2p", True)
        y = _grouped(a, w, offsets, ids)
        if mask is not None:
            y = torch.where(mask, 0, y)
        z = y * scale if scale is not None else y
        s = z[slot_rows] if slot_rows is not None else z
        ref = s.view(tokens, k, -1).sum(1)
        dist.all_reduce(ref)
        results.append(("forward", form, tokens, k, bands, _rel(out, ref), _rel(rows, y)))

        # backward: g [M, kk] @ wt [E, kk, n2] -> scatter into tokens; dw against x [M, n2]
        wt = rand(ws, 4, 6, 3, seed=seed + 5)[rank]
        g = a
        x = rand(m, 3, seed=seed + 6) if form == "offsets" else None
        with knobs.tp_experts.patch(BANDS=bands):
            dx, dw = torch.ops.overlap.moe_tp_experts_backward(g, wt, offsets, ids, mask, tok, tokens, x, "sum",
                                                               name, "p2p")
        d = _grouped(g, wt, offsets, ids)
        if mask is not None:
            d = torch.where(mask, 0, d)
        ref_dx = torch.zeros(tokens, 3).index_put_((tok,), d, accumulate=True)
        dist.all_reduce(ref_dx)
        err_dw = 0.0
        if x is not None:
            ref_dw = torch.zeros(4, 3, 6)
            start = 0
            for e, end in enumerate(offsets.tolist()):
                ref_dw[e] = x[start:end].T @ g[start:end]
                start = end
            err_dw = _rel(dw, ref_dw)
        results.append(("backward", form, tokens, k, bands, _rel(dx, ref_dx), err_dw))

    # an exception in band 3 (on every rank): the two started all-reduces are waited on before it
    # propagates, so the group's next collective pairs up
    a, w, offsets, _, slot_rows, _ = problem(7, 16, 2, 4, 6, 5, "offsets", False)
    real, calls = tp_experts_p2p.rows_gemm, []

    def failing(*args):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("band 3 fails")
        return real(*args)

    tp_experts_p2p.rows_gemm = failing
    try:
        with knobs.tp_experts.patch(BANDS=4):
            torch.ops.overlap.moe_tp_experts(a, w, offsets, None, None, None, slot_rows, 2, "sum", name, "p2p", False)
        raised = False
    except RuntimeError as e:
        raised = "band 3 fails" in str(e)
    finally:
        tp_experts_p2p.rows_gemm = real
    after = torch.full((3,), float(rank + 1))
    dist.all_reduce(after)
    return {"results": results, "raised": raised, "after": after.tolist()}


@pytest.mark.timeout(300)
def test_moe_tp_experts_ops_match_their_semantics():
    out = run_ranks(tp_experts_worker, 2, timeout=240)
    for rank, r in enumerate(out):
        bad = [res for res in r["results"] if not (res[5] <= 1e-5 and res[6] <= 1e-5)]
        assert not bad, f"rank {rank}: {bad}"
        assert len(r["results"]) == 2 * 4 * 2 * 3
        assert r["raised"], rank
        assert r["after"] == [3.0, 3.0, 3.0], r["after"]
