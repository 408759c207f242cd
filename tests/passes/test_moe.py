"""The ``moe`` pass, the ``moe_experts`` op and the reference MoE layer.

- compiled vs eager on real gloo ranks (2 and 4): both token policies, the three expert-GEMM forms,
  forward and backward, with ``OVERLAP_INDUCTOR=0`` (one Inductor run, marked slow);
- exact graphs of the pass on the fake process group (4 ranks), rejections with their reasons;
- the p2p lowering against ``all_to_all_single`` + experts on random data (hypothesis, drawn in
  lockstep on every rank as in ``test_p2p_lowering.py``).
"""

import pytest
import torch

from dist_harness import run_batch

C10D = torch.ops._c10d_functional
WS = 4
FORMS = ("grouped_mm", "bmm", "loop")
POLICIES = ("capacity", "dropless")


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    if torch.isnan(a).any() or torch.isnan(b).any():
        return float("nan")
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _tol(form):
    # torch._grouped_mm only takes bfloat16 under torch.compile: that form runs its GEMMs in bf16
    # (eager too), and the lowering sums in another order than _grouped_mm does.
    return 1e-2 if form == "grouped_mm" else 1e-4


# ------------------------------------------------------------------------ compiled vs eager
@torch._dynamo.config.patch(capture_scalar_outputs=True)  # dropless: .tolist() of the split sizes
def layer_worker(rank, ws, cases, skew):
    import torch

    import overlap_backend
    from overlap_backend.models.moe import MoELayer

    tokens, hidden, ffn, experts = 6, 16, 32, 2 * ws
    x = torch.randn(ws, tokens, hidden, generator=torch.Generator().manual_seed(5))[rank]
    if skew:
        x = x + 1.0  # with the router below: expert 0 is every token's first choice
    probe = torch.cos(torch.arange(tokens * hidden, dtype=torch.float32)).view(tokens, hidden)

    def build(policy, form):
        m = MoELayer(hidden, ffn, experts, top_k=2, policy=policy, expert_form=form, capacity_factor=1.0, seed=3)
        if skew:  # one expert takes every token, others none: zero splits, empty expert groups
            with torch.no_grad():
                m.router[:, 0] += 4.0 * m.router.abs().max()
        return m

    with torch.no_grad():  # tokens this rank routes to each expert (the test checks the skew happened)
        chosen = build("dropless", "loop").route(x)[0].view(-1)
        routed = torch.bincount(chosen, minlength=experts).tolist()

    def step(model):
        xi = x.clone().requires_grad_()
        out = model(xi)
        (out * probe).sum().backward()
        return [out, xi.grad] + [p.grad for p in model.parameters()]

    results = {"routed": routed}
    for policy, form in cases:
        torch._dynamo.reset()
        ref = step(build(policy, form))
        backend = overlap_backend.make_backend(inductor=False)
        got = step(torch.compile(build(policy, form), backend=backend, fullgraph=True))
        results[(policy, form)] = {
            "errs": [_rel(g, r) for g, r in zip(got, ref)],
            "decisions": [(r.kind, m.pass_name, m.applied, m.reason) for r in backend.reports for m in r.matches],
            "ref_norm": ref[0].norm().item(),
        }
    return results


def _check_layers(per_rank, cases, skewed=False):
    routed = torch.tensor([r["routed"] for r in per_rank])  # [source rank, expert]
    if skewed:
        ws = len(per_rank)
        sends = routed.view(ws, ws, -1).sum(-1)  # [source, destination rank]
        assert (routed.sum(0) == 0).any(), f"no expert without tokens: {routed.tolist()}"
        assert (sends == 0).any(), f"no rank pair without tokens: {sends.tolist()}"
    for case in cases:
        decisions = per_rank[0][case]["decisions"]
        for rank, res in enumerate(per_rank):
            r = res[case]
            assert r["ref_norm"] > 0, f"{case} rank {rank}: the eager layer returned zeros (test is vacuous)"
            assert all(e <= _tol(case[1]) for e in r["errs"]), f"{case} rank {rank}: rel errors {r['errs']}"
            assert r["decisions"] == decisions, f"{case}: rank {rank} decided differently"
        fwd = [d for d in decisions if d[1] == "moe" and d[0] == "forward"]
        assert fwd and all(d[2] for d in fwd), f"{case}: forward MoE block not rewritten: {decisions}"
        bwd = [d for d in decisions if d[1] == "moe" and d[0] == "backward"]
        # the expert gradients: moe_experts_backward (checked by errs above); dropless bmm's backward reads the
        # padded input's zero base as a saved tensor, which the forward recorded (passes/saved.py)
        assert bwd and all(d[2] for d in bwd), f"{case}: backward expert gradients not rewritten: {decisions}"


ALL_CASES = [(p, f) for p in POLICIES for f in FORMS]


SKEWED_CASES = [("dropless", "grouped_mm"), ("dropless", "loop"), ("capacity", "bmm")]
_RUNS: dict[int, dict] = {}


def _gloo_runs(ws: int) -> dict:
    """The multi-rank checks of this file at ``ws`` ranks, in one process group per world size (one start
    of the ranks and their imports): the ops against their semantics, and at 2 and 4 ranks the layers."""
    if ws not in _RUNS:
        calls = {"op": (op_worker, (25,)), "backward": (backward_op_worker, (25,))}
        if ws == 2:
            calls.update(layers=(layer_worker, (ALL_CASES, False)), symbolic=(symbolic_tokens_worker, ((6, 10, 13),)))
        if ws == 4:
            calls.update(layers=(layer_worker, (SKEWED_CASES, True)))
        _RUNS[ws] = run_batch(calls, ws, timeout=600)
    return _RUNS[ws]


@pytest.mark.timeout(700)
def test_layer_matches_eager_2_ranks():
    """Every policy x form, forward and backward, 2 gloo ranks."""
    _check_layers(_gloo_runs(2)["layers"].get(), ALL_CASES)


@pytest.mark.timeout(700)
def test_layer_matches_eager_4_ranks_skewed():
    """4 ranks, routing skewed so that some experts (and some rank pairs) get no tokens."""
    _check_layers(_gloo_runs(4)["layers"].get(), SKEWED_CASES, skewed=True)


# ----------------------------------------------------------------- exact graphs (fake PG)
def _targets(graph):
    return [n.target for n in graph.nodes if n.op == "call_function"]


def _only(graph, target):
    nodes = [n for n in graph.nodes if n.target is target]
    assert len(nodes) == 1, f"expected one {target}, got {len(nodes)}:\n{graph}"
    return nodes[0]


@pytest.fixture
def graphs(capture, monkeypatch):
    """Keep each rewritten graph (``backend.graphs``), and run ``moe_experts`` as a shape-only stub:
    the fake group communicates nothing, so the dropless split sizes it yields need not agree."""
    from overlap_backend.runtime import lowering
    from overlap_backend.runtime.ops import MOE_SAVED

    def stub(x, send, recv, rows, offsets, sizes, w_gate, w_up, w_down, group_name, saved, comm_sms=-1):
        m, f = rows.shape[0], w_gate.shape[2]
        shapes = {"recv": (sum(recv), x.shape[1]), "xg": (m, x.shape[1]), "gate": (m, f), "up": (m, f), "act": (m, f)}
        values = [
            torch.zeros(shapes[n], dtype=x.dtype if n == "recv" else w_gate.dtype) if want else x.new_empty((0,))
            for n, want in zip(MOE_SAVED, saved)
        ]
        return torch.zeros_like(x), values

    def stub_backward(grad, send, recv, rows, offsets, sizes, gate, up, wt_gate, wt_up, wt_down, group_name):
        m, h, f = rows.shape[0], grad.shape[1], gate.shape[1]
        cd = wt_gate.dtype
        return torch.zeros_like(grad), torch.zeros(m, h, dtype=cd), torch.zeros(m, f, dtype=cd), torch.zeros(m, f, dtype=cd)

    monkeypatch.setitem(lowering._IMPLS["p2p"], "moe_experts", stub)
    monkeypatch.setitem(lowering._IMPLS["p2p"], "moe_experts_backward", stub_backward)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        yield


def _compile_layer(policy, form, train=False, **backend_kw):
    from overlap_backend import make_backend
    from overlap_backend.models.moe import MoELayer

    torch.manual_seed(0)  # the routing (and with it the graph) must not depend on the tests run before
    layer = MoELayer(16, 32, 2 * WS, top_k=2, policy=policy, expert_form=form, capacity_factor=1.0)
    backend = make_backend(inductor=False, **backend_kw)
    x = torch.randn(6, 16, requires_grad=train)
    compiled = torch.compile(layer, backend=backend, fullgraph=True)
    if train:
        compiled(x).sum().backward()
    else:
        with torch.no_grad():
            compiled(x)
    return layer, backend


def _moe_records(backend, kind=None):
    return [m for r in backend.reports for m in r.matches if m.pass_name == "moe" and kind in (None, r.kind)]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("form", FORMS)
def test_pass_rewrites_every_form(fake_pg, graphs, policy, form):
    layer, be = _compile_layer(policy, form)
    (rec,) = _moe_records(be)
    assert rec.applied and rec.lowering == "p2p" and rec.reason == "rewritten"
    g = be.graphs[0]
    op = _only(g, torch.ops.overlap.moe_experts.default)
    x, send, recv, rows, offsets, sizes, wg, wu, wd, group_name, lowering, saved, comm_sms = op.args
    assert group_name == fake_pg.group_name and lowering == "p2p" and saved == [False] * 5
    assert comm_sms == 0  # OVERLAP_MOE_COMM_SMS's default, fixed in the graph
    assert len(send) == len(recv) == WS
    # the expert GEMMs are gone: the router's mm is the only matmul left
    ts = _targets(g)
    assert aten_count(ts, torch.ops.aten.bmm.default, torch.ops.aten._grouped_mm.default) == 0
    assert ts.count(torch.ops.aten.mm.default) == 1
    # dispatch and combine are gone; dropless keeps its count exchange (int64 counts)
    a2as = [n for n in g.nodes if n.target is C10D.all_to_all_single.default]
    assert len(a2as) == (1 if policy == "dropless" else 0)
    assert all(n.meta["val"].dtype == torch.int64 for n in a2as)
    if form == "grouped_mm":
        assert offsets is not None and sizes == [] and wg.meta["val"].dtype == torch.bfloat16
    else:
        assert offsets is None and len(sizes) == 2  # two local experts
        # loop: the per-expert selects are folded back into the stacked parameter
        assert [n.op for n in (wg, wu, wd)] == ["placeholder"] * 3
    if policy == "capacity":
        assert all(isinstance(s, int) for s in send + recv)
    else:
        assert not any(isinstance(s, int) for s in send + recv)  # unbacked split sizes


def test_comm_sms_setting_reaches_the_op(fake_pg, graphs):
    """make_backend(moe_comm_sms=n) is written into the op (it used to be read from the environment by
    the op at run time, ignoring the backend's value); with auto and the cost model not deciding (CPU)
    the op keeps its default, -1: OVERLAP_MOE_COMM_SMS when it runs."""
    for setting, expected in ((4, 4), (0, 0), ("auto", None)):
        _, be = _compile_layer("capacity", "grouped_mm", moe_comm_sms=setting)
        op = _only(be.graphs[0], torch.ops.overlap.moe_experts.default)
        written = op.args[12] if len(op.args) > 12 else op.kwargs.get("comm_sms")
        assert written == expected, (setting, op.args)


def aten_count(targets, *wanted):
    return sum(t in wanted for t in targets)


@pytest.mark.parametrize("policy, form, saved", [
    ("capacity", "bmm", {"xg", "gate", "up", "act"}),
    ("dropless", "grouped_mm", {"xg", "gate", "up", "act"}),
    ("dropless", "loop", {"xg", "gate", "up", "act"}),
])
def test_training_forward_saves_and_backward_gets_its_op(fake_pg, graphs, policy, form, saved):
    """A training forward's op hands out what the backward reads; the backward's all-to-all pair and
    the expert input gradients between them become one moe_experts_backward, whose dY, dG, dU feed
    the weight-gradient GEMMs left in the graph (three; the loop form's, three per expert)."""
    from overlap_backend.runtime.ops import MOE_SAVED

    layer, be = _compile_layer(policy, form, train=True)
    kinds = [r.kind for r in be.reports]
    assert kinds == ["forward", "backward"]
    (fwd,) = _moe_records(be, "forward")
    assert fwd.applied
    op = _only(be.graphs[0], torch.ops.overlap.moe_experts.default)
    assert {n for n, want in zip(MOE_SAVED, op.args[11]) if want} == saved
    # what the backward reads comes from the op, not from a second copy of the expert GEMMs
    assert aten_count(_targets(be.graphs[0]), torch.ops.aten.bmm.default, torch.ops.aten._grouped_mm.default) == 0
    assert _targets(be.graphs[0]).count(torch.ops.aten.mm.default) == 1
    (bwd,) = _moe_records(be, "backward")
    assert all(p.grad is not None and p.grad.shape == p.shape for p in layer.parameters())
    assert bwd.applied and bwd.lowering == "p2p", bwd.reason
    g = be.graphs[1]
    op = _only(g, torch.ops.overlap.moe_experts_backward.default)
    grad, send, recv, rows, offsets, sizes, gate, up, wt_gate, wt_up, wt_down, group_name, lowering = op.args
    assert group_name == fake_pg.group_name and lowering == "p2p" and len(send) == len(recv) == WS
    assert [tuple(w.meta["val"].shape) for w in (wt_gate, wt_up, wt_down)] == [(2, 32, 16), (2, 32, 16), (2, 16, 32)]
    ts = _targets(g)
    assert C10D.all_to_all_single.default not in ts
    gemm = {"bmm": torch.ops.aten.bmm.default, "grouped_mm": torch.ops.aten._grouped_mm.default,
            "loop": torch.ops.aten.mm.default}[form]
    outs = {u.args[1]: u for u in op.users}
    assert sorted(outs) == [0, 1, 2, 3]
    # A^T dY, X^T dG, X^T dU (per expert in the loop form): the weight gradients, left to the graph, read the op
    wgrads = [n for n in g.nodes if n.target is gemm and any(o in common_ancestors(n) for o in outs.values())]
    assert len(wgrads) == 3 * (2 if form == "loop" else 1), wgrads
    if form != "loop":  # no input-gradient GEMM is left
        assert len([n for n in g.nodes if n.target is gemm]) == 3
    read = {i for i, o in outs.items() for w in wgrads if o in common_ancestors(w)}
    assert read == {1, 2, 3}, read  # each weight gradient reads one of dY, dG, dU
    assert [tuple(val.shape) for val in op.meta["val"]][1:] == [
        (rows.meta["val"].shape[0], 16), (rows.meta["val"].shape[0], 32), (rows.meta["val"].shape[0], 32)]


def common_ancestors(node):
    from overlap_backend.passes.fx import ancestors

    return ancestors(node)


def test_passes_toggle_leaves_moe_alone(fake_pg, graphs):
    _, be = _compile_layer("capacity", "bmm", passes=["mm_ar"])
    assert not _moe_records(be)
    assert torch.ops.overlap.moe_experts.default not in _targets(be.graphs[0])


def test_min_numel_rejects_small_blocks(fake_pg, graphs):
    _, be = _compile_layer("capacity", "bmm", min_numel=10**6)
    (rec,) = _moe_records(be)
    assert not rec.applied and "OVERLAP_MIN_NUMEL" in rec.reason


# rejections, on hand-written capacity-style blocks: x [ws*E*C, H] -> experts -> back
def _block(fake_pg, *, act="silu", undo=True, swap=True, leak=False, keep_recv=False, shared=False):
    import torch.distributed._functional_collectives as funcol
    import torch.nn.functional as F

    E, C, H = 2, 3, 8

    def f(x, wg, wu, wd):
        recv = funcol.all_to_all_single(x, None, None, fake_pg)
        xe = recv.view(WS, E, C, H).transpose(0, 1).reshape(E, WS * C, H)
        g = torch.bmm(xe, wg)
        a = (F.silu(g) if act == "silu" else F.gelu(g)) * torch.bmm(xe, wu)
        y = torch.bmm(a, wd)
        if shared:  # something added to the experts' output before the combine (a forward graph's add)
            y = y + torch.bmm(xe, wg[:, :, :H])
        back = y.view(E, WS, C, H).transpose(0, 1) if undo else y.view(WS, E, C, H)
        back = back.reshape(WS * E * C, H)
        splits = [C * E] * WS
        out_splits = splits if swap else [C * E - 1, C * E + 1] * (WS // 2)
        out = funcol.all_to_all_single(back, out_splits, splits, fake_pg)
        if keep_recv:
            return out, recv.sum(0)
        return (out, y.sum()) if leak else out

    args = (torch.randn(WS * E * C, H), torch.randn(E, H, 16), torch.randn(E, H, 16), torch.randn(E, 16, H))
    return f, args


@pytest.mark.parametrize("variant, reason", [
    (dict(act="gelu"), "is not silu(gate) * up"),
    (dict(undo=False), "do not undo those before them"),
    (dict(swap=False), "not the dispatch's, swapped"),
    (dict(leak=True), "is also used by"),
    # an add before the combine is where a backward's input gradients end: a forward's says what it is not
    (dict(shared=True), "neither moved rows of expert GEMMs nor the experts' input gradients"),
])
def test_rejections_are_reported(fake_pg, graphs, variant, reason):
    from overlap_backend import make_backend

    f, args = _block(fake_pg, **variant)
    be = make_backend(inductor=False)
    torch.compile(f, backend=be, fullgraph=True)(*args)
    (rec,) = _moe_records(be)
    assert not rec.applied and reason in rec.reason, rec.reason
    g = be.graphs[0]
    assert torch.ops.overlap.moe_experts.default not in _targets(g)
    assert _targets(g).count(C10D.all_to_all_single.default) == 2  # left alone


@pytest.mark.parametrize("keep_recv", [False, True])
def test_hand_written_block_rewritten(fake_pg, graphs, keep_recv):
    """The same block as the rejections, written right: one op (guards the rejection tests). When
    the received rows are read elsewhere too, the op hands them out (saved "recv")."""
    from overlap_backend import make_backend

    f, args = _block(fake_pg, keep_recv=keep_recv)
    be = make_backend(inductor=False)
    torch.compile(f, backend=be, fullgraph=True)(*args)
    (rec,) = _moe_records(be)
    assert rec.applied, rec.reason
    g = be.graphs[0]
    op = _only(g, torch.ops.overlap.moe_experts.default)
    assert op.args[11] == [keep_recv, False, False, False, False]
    assert C10D.all_to_all_single.default not in _targets(g)


# ------------------------------------------------------------- the p2p op vs the collectives
def _reference(x, send, recv, rows, ends, w_gate, w_up, w_down, group):
    """``moe_experts``'s documented semantics with ``dist.all_to_all_single`` and per-expert mm."""
    import torch.distributed as dist
    import torch.nn.functional as F

    cd, h, f = w_gate.dtype, x.shape[1], w_gate.shape[2]
    received = x.new_empty((sum(recv), h))
    dist.all_to_all_single(received, x, recv, send, group=group)
    m = rows.shape[0]
    ok = rows >= 0
    xg = torch.zeros(m, h, dtype=cd)
    xg[ok] = received[rows[ok]].to(cd)
    gate, up, act = (torch.zeros(m, f, dtype=cd) for _ in range(3))
    y = torch.zeros(m, h, dtype=cd)
    start = 0
    for e, end in enumerate(ends):
        r = slice(start, end)
        gate[r], up[r] = xg[r] @ w_gate[e], xg[r] @ w_up[e]
        act[r] = F.silu(gate[r]) * up[r]
        y[r] = act[r] @ w_down[e]
        start = end
    y_recv = torch.zeros_like(received)
    y_recv[rows[ok]] = y[ok].to(x.dtype)
    out = torch.empty_like(x)
    dist.all_to_all_single(out, y_recv, send, recv, group=group)
    return out, [received, xg, gate, up, act]


def _routing_case(rank, ws, counts, experts, pad, use_offsets, g):
    """A routing drawn in lockstep on every rank: this rank's splits, its grouped rows (the received rows
    in random order, a few zero rows -1 among them) and the experts' ends, as offsets or sizes."""
    sendmat = torch.tensor(counts).view(ws, ws)  # sendmat[s, d]: rows s sends to d
    send, recv = sendmat[rank].tolist(), sendmat[:, rank].tolist()
    n = sum(recv)
    perm = torch.randperm(n + pad, generator=g)
    rows = torch.where(perm < n, perm, -1)
    ends = sorted(torch.randint(0, n + pad + 1, (experts,), generator=g).tolist())
    if use_offsets:
        offsets, sizes = torch.tensor(ends, dtype=torch.int32), []
    else:
        offsets, sizes = None, [b - a for a, b in zip([0] + ends[:-1], ends)]
    return send, recv, rows, ends, offsets, sizes


def op_worker(rank, ws, max_examples):
    import torch
    import torch.distributed as dist
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    import overlap_backend  # noqa: F401  registers torch.ops.overlap

    group = dist.group.WORLD
    failures = []

    @settings(
        max_examples=max_examples, derandomize=True, database=None, deadline=None,
        phases=[Phase.generate], suppress_health_check=list(HealthCheck),
    )
    @given(
        counts=st.lists(st.integers(0, 4), min_size=ws * ws, max_size=ws * ws),
        experts=st.integers(1, 3), h=st.integers(1, 9), f=st.integers(1, 7), pad=st.integers(0, 3),
        use_offsets=st.booleans(), saved=st.lists(st.booleans(), min_size=5, max_size=5),
        bf16=st.booleans(), seed=st.integers(0, 2**16),
    )
    def check(counts, experts, h, f, pad, use_offsets, saved, bf16, seed):
        g = torch.Generator().manual_seed(seed)
        cd = torch.bfloat16 if bf16 else torch.float32
        send = torch.tensor(counts).view(ws, ws)[rank].tolist()
        x = torch.randn(ws, max(sum(send), 1), h, generator=g)[rank][: sum(send)].contiguous()
        w = [torch.randn(ws, experts, *shape, generator=g)[rank].to(cd) for shape in ((h, f), (h, f), (f, h))]
        send, recv, rows, ends, offsets, sizes = _routing_case(rank, ws, counts, experts, pad, use_offsets, g)
        out, values = torch.ops.overlap.moe_experts(x, send, recv, rows, offsets, sizes, *w, group.group_name, "p2p", saved)
        ref_out, ref_values = _reference(x, send, recv, rows, ends, *w, group)
        tol = 2e-2 if bf16 else 1e-5
        errs = [_rel(out, ref_out) if out.numel() else 0.0]
        for want, v, r in zip(saved, values, ref_values):
            if want:
                errs.append(_rel(v.float(), r.float()) if r.numel() and r.abs().max() > 0 else float((v != 0).sum()))
            elif v.numel():
                errs.append(float("inf"))  # an unrequested value must be empty
        if not all(e <= tol for e in errs) or out.dtype != x.dtype:
            failures.append((counts, experts, h, f, pad, use_offsets, saved, bf16, seed, errs))

    check()
    # A bad argument is refused before any communication, on every rank alike: splits that do not
    # add up, and a comm SM count beyond the setting's range (a comm kernel holding most SMs would
    # starve the GEMMs it spins on).
    refused = []
    for rows_x, comm_sms in ((ws + 2, -1), (ws, 200)):
        try:
            torch.ops.overlap.moe_experts(
                torch.randn(rows_x, 4), [1] * ws, [1] * ws, torch.arange(ws), None, [ws], torch.randn(1, 4, 2),
                torch.randn(1, 4, 2), torch.randn(1, 2, 4), group.group_name, "p2p", [False] * 5, comm_sms,
            )
            refused.append(None)
        except ValueError as e:
            refused.append(str(e))
    return failures, refused


@pytest.mark.timeout(700)
@pytest.mark.parametrize("ws", [2, 3, 4])
def test_p2p_op_matches_all_to_all_and_experts(ws):
    for failures, refused in _gloo_runs(ws)["op"].get():
        assert not failures, failures[:3]
        assert refused[0] is not None and f"do not add up to the {ws + 2} rows of x" in refused[0], refused
        assert refused[1] is not None and "comm_sms" in refused[1] and "got 200" in refused[1], refused


def _reference_backward(grad, send, recv, rows, ends, w_gate, w_up, w_down, group):
    """``moe_experts_backward``'s documented semantics by autograd, in float32: the forward's G and U
    (computed here from random grouped rows), and what the op must return for them."""
    import torch.distributed as dist
    import torch.nn.functional as F

    cd, h, f, m = w_gate.dtype, grad.shape[1], w_gate.shape[2], rows.shape[0]
    received = grad.new_empty((sum(recv), h))
    dist.all_to_all_single(received, grad, recv, send, group=group)
    ok = rows >= 0
    dy = torch.zeros(m, h)
    dy[ok] = received[rows[ok]].to(cd).float()
    xg = torch.randn(m, h, generator=torch.Generator().manual_seed(m + h)).to(cd).float().requires_grad_()
    parts_g, parts_u, start = [], [], 0
    for e, end in enumerate(ends):
        parts_g.append(xg[start:end] @ w_gate[e].float())
        parts_u.append(xg[start:end] @ w_up[e].float())
        start = end
    parts_g.append(torch.zeros(m - start, f))
    parts_u.append(torch.zeros(m - start, f))
    gate, up = torch.cat(parts_g), torch.cat(parts_u)
    gate, up = gate.to(cd).float().detach().requires_grad_(), up.to(cd).float().detach().requires_grad_()
    act = F.silu(gate) * up
    y, start = torch.zeros(m, h), 0
    for e, end in enumerate(ends):
        y = y + F.pad(act[start:end] @ w_down[e].float(), (0, 0, start, m - end))
        start = end
    (y * dy).sum().backward()
    dxg, start = torch.zeros(m, h), 0
    for e, end in enumerate(ends):
        dxg[start:end] = gate.grad[start:end] @ w_gate[e].float().T + up.grad[start:end] @ w_up[e].float().T
        start = end
    d_recv = torch.zeros(sum(recv), h)
    d_recv.index_add_(0, rows[ok], dxg[ok])
    dx = torch.empty(grad.shape)
    dist.all_to_all_single(dx, d_recv.to(grad.dtype).float(), send, recv, group=group)
    return (gate.detach().to(cd), up.detach().to(cd)), (dx, dy, gate.grad, up.grad)


def backward_op_worker(rank, ws, max_examples):
    import torch
    import torch.distributed as dist
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    import overlap_backend  # noqa: F401  registers torch.ops.overlap

    group = dist.group.WORLD
    failures = []

    @settings(
        max_examples=max_examples, derandomize=True, database=None, deadline=None,
        phases=[Phase.generate], suppress_health_check=list(HealthCheck),
    )
    @given(
        counts=st.lists(st.integers(0, 4), min_size=ws * ws, max_size=ws * ws),
        experts=st.integers(1, 3), h=st.integers(1, 9), f=st.integers(1, 7), pad=st.integers(0, 3),
        use_offsets=st.booleans(), repeat=st.booleans(), bf16=st.booleans(), seed=st.integers(0, 2**16),
    )
    def check(counts, experts, h, f, pad, use_offsets, repeat, bf16, seed):
        g = torch.Generator().manual_seed(seed)
        cd = torch.bfloat16 if bf16 else torch.float32
        send = torch.tensor(counts).view(ws, ws)[rank].tolist()
        grad = torch.randn(ws, max(sum(send), 1), h, generator=g)[rank][: sum(send)].contiguous()
        w = [torch.randn(ws, experts, *shape, generator=g)[rank].to(cd) for shape in ((h, f), (h, f), (f, h))]
        send, recv, rows, ends, offsets, sizes = _routing_case(rank, ws, counts, experts, pad, use_offsets, g)
        if repeat and sum(recv):  # a received row read by two grouped rows: its gradients add up
            rows[torch.nonzero(rows >= 0)[-1]] = rows[torch.nonzero(rows >= 0)[0]]
        (gate, up), ref = _reference_backward(grad, send, recv, rows, ends, *w, group)
        wt = [w[0].transpose(1, 2), w[1].transpose(1, 2), w[2].transpose(1, 2)]
        got = torch.ops.overlap.moe_experts_backward(grad, send, recv, rows, offsets, sizes, gate, up, *wt,
                                                     group.group_name, "p2p")
        tol = 3e-2 if bf16 else 1e-5
        errs = []
        for v, r in zip(got, ref):
            errs.append(_rel(v.float(), r) if r.numel() and r.abs().max() > 0 else float((v != 0).sum()))
        dtypes = [v.dtype for v in got] == [grad.dtype, cd, cd, cd]
        if not all(e <= tol for e in errs) or not dtypes:
            failures.append((counts, experts, h, f, pad, use_offsets, repeat, bf16, seed, errs))

    check()
    refused = None
    try:  # wt_down of the wrong shape: refused before any communication, on every rank
        torch.ops.overlap.moe_experts_backward(
            torch.randn(ws, 4), [1] * ws, [1] * ws, torch.arange(ws), None, [ws], torch.randn(ws, 2),
            torch.randn(ws, 2), torch.randn(1, 2, 4), torch.randn(1, 2, 4), torch.randn(1, 2, 4), group.group_name,
            "p2p")
    except ValueError as e:
        refused = str(e)
    return failures, refused


@pytest.mark.timeout(700)
@pytest.mark.parametrize("ws", [2, 3, 4])
def test_p2p_backward_op_matches_autograd(ws):
    """``moe_experts_backward`` on the p2p lowering against autograd through the forward's semantics:
    dx (after the return all-to-all), dY, dG, dU; empty splits, zero rows, rows past the last expert,
    a received row read twice (its gradients add), float32 and bf16."""
    for failures, refused in _gloo_runs(ws)["backward"].get():
        assert not failures, failures[:3]
        assert refused is not None and "wt_down" in refused and "[1, 4, 2]" in refused, refused


# ------------------------------------------------------------------------ Inductor end to end
@torch._dynamo.config.patch(capture_scalar_outputs=True)  # dropless: .tolist() of the split sizes
def inductor_worker(rank, ws, policy="dropless", form="grouped_mm"):
    import torch

    import overlap_backend
    from overlap_backend.models.moe import MoELayer

    x = torch.randn(ws, 6, 16, generator=torch.Generator().manual_seed(5))[rank]
    probe = torch.sin(torch.arange(6 * 16, dtype=torch.float32)).view(6, 16)

    def step(model):
        xi = x.clone().requires_grad_()
        out = model(xi)
        (out * probe).sum().backward()
        return [out, xi.grad] + [p.grad for p in model.parameters()]

    def build():
        return MoELayer(16, 32, 2 * ws, top_k=2, policy=policy, expert_form=form, seed=3)

    ref = step(build())
    got = step(torch.compile(build(), backend="overlap", fullgraph=True))
    decisions = [(r.kind, m.pass_name, m.applied) for r in overlap_backend.REPORTS for m in r.matches]
    return [_rel(g, r) for g, r in zip(got, ref)], decisions


def inductor_case(rank, ws, policy, form):
    """``inductor_worker`` as one case of several in a process: its own reports and Dynamo caches."""
    import overlap_backend

    torch._dynamo.reset()
    overlap_backend.REPORTS.clear()
    return inductor_worker(rank, ws, policy, form)


INDUCTOR_FORMS = ["grouped_mm", "loop"]
_INDUCTOR_RUNS: dict = {}


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("form", INDUCTOR_FORMS)
def test_inductor_forward_backward(clean_env, policy, form):
    """Inductor codegen around the ops (its partitioner decides what the backward reads): unbacked split
    sizes (dropless), saved values, the backward's op (in the loop form after Inductor's post-grad
    patterns folded each expert's mm + mm into an addmm). Every case in one process group."""
    if not _INDUCTOR_RUNS:
        _INDUCTOR_RUNS.update(run_batch({(p, f): (inductor_case, (p, f)) for p in POLICIES for f in INDUCTOR_FORMS}, 2,
                                        timeout=1100, env={"OVERLAP_INDUCTOR": "1"}))
    per_rank = _INDUCTOR_RUNS[(policy, form)].get()
    for errs, decisions in per_rank:
        assert all(e <= 1e-2 for e in errs), errs
        assert decisions == per_rank[0][1]
        assert ("forward", "moe", True) in decisions and ("backward", "moe", True) in decisions


@torch._dynamo.config.patch(capture_scalar_outputs=True)  # dropless: .tolist() of the split sizes
def symbolic_tokens_worker(rank, ws, lengths):
    """Dropless and capacity MoE layers compiled once with a symbolic token count (mark_dynamic on
    dim 0), inference, against eager for every length."""
    import torch

    import overlap_backend
    from overlap_backend.models.moe import MoELayer

    out = {}
    for policy in POLICIES:
        torch._dynamo.reset()
        layer = MoELayer(16, 32, 2 * ws, top_k=2, policy=policy, expert_form="loop", capacity_factor=1.0, seed=3)
        frames = []
        inner = overlap_backend.make_backend(inductor=False)

        def backend(gm, example_inputs, inner=inner):
            frames.append(gm)
            return inner(gm, example_inputs)

        compiled = torch.compile(layer, backend=backend, fullgraph=True)
        errs = []
        with torch.no_grad():
            for n in lengths:
                x = torch.randn(ws, n, 16, generator=torch.Generator().manual_seed(n))[rank]
                torch._dynamo.mark_dynamic(x, 0)
                errs.append(_rel(compiled(x), layer(x)))
        out[policy] = {"errs": errs, "frames": len(frames),
                       "decisions": [(m.pass_name, m.applied, m.reason) for r in inner.reports for m in r.matches]}
    return out


@pytest.mark.timeout(700)
def test_symbolic_token_count_2_ranks():
    """Dropless routing is rewritten on a symbolic token count and compiled once for every length;
    capacity routing is reported, not rewritten (its padded row moves are checked on concrete row
    ids, which a symbolic length does not give), and still right."""
    for res in _gloo_runs(2)["symbolic"].get():
        for policy, r in res.items():
            assert r["frames"] == 1, (policy, r)
            assert all(e <= 1e-4 for e in r["errs"]), (policy, r["errs"])
            moe = [d for d in r["decisions"] if d[0] == "moe"]
            assert moe and all(d[1] is (policy == "dropless") for d in moe), (policy, moe)
        assert "symbolic shapes" in [d for d in res["capacity"]["decisions"] if d[0] == "moe"][0][2]


@pytest.mark.parametrize("policy", POLICIES)
def test_graph_partitions_price_dropless_eagerly(fake_pg, graphs, policy, monkeypatch):
    """Under CUDA graphs with Inductor's graph partitions the graph counts as captured, but a dropless
    block's data-dependent sizes put its op outside the captured partitions: it is priced with its host
    time (no ``cuda_graphs`` in its cost record); a capacity block's op is priced as a replay."""
    from overlap_backend import backend

    from overlap_backend.passes import lowerings

    monkeypatch.setattr(backend, "_cuda_graphs_on", lambda config: True)
    monkeypatch.setattr(backend, "_graph_partitions_on", lambda: True)
    monkeypatch.setattr(lowerings, "choose_lowering", lambda ctx, group, device: "symm")  # a symm-capable group
    _, be = _compile_layer(policy, "grouped_mm", cost_model="on")
    (rec,) = _moe_records(be)
    assert rec.cost is not None and rec.cost.get("active"), rec.cost
    assert rec.cost.get("cuda_graphs", False) == (policy == "capacity"), rec.cost


def test_captured_blocks_that_would_run_p2p_are_left_alone(fake_pg, graphs, monkeypatch):
    """A block replayed from a CUDA graph is not rewritten where its op would run on p2p, which reads the
    per-expert counts on the host (a capture cannot): a p2p group, and a training forward (its op hands
    out saved values, which only p2p does) and the backward (moe_experts_backward is p2p only, and
    tagged cudagraph-unsafe). With a symm-capable group an inference block is still rewritten."""
    from overlap_backend import backend
    from overlap_backend.passes import lowerings

    monkeypatch.setattr(backend, "_cuda_graphs_on", lambda config: True)
    # (with partitions a capacity block's static sizes are captured; without, the CPU tensors of this
    # test would keep the whole graph out of the capture)
    monkeypatch.setattr(backend, "_graph_partitions_on", lambda: True)
    _, be = _compile_layer("capacity", "grouped_mm")
    (rec,) = _moe_records(be)
    assert not rec.applied and "replayed from a CUDA graph" in rec.reason and "p2p" in rec.reason, rec.reason
    monkeypatch.setattr(lowerings, "choose_lowering", lambda ctx, group, device: "symm")
    _, be = _compile_layer("capacity", "grouped_mm")
    (rec,) = _moe_records(be)
    assert rec.applied and rec.lowering == "symm", rec.reason
    _, be = _compile_layer("capacity", "grouped_mm", train=True)
    for kind in ("forward", "backward"):
        (rec,) = _moe_records(be, kind)
        assert not rec.applied and "replayed from a CUDA graph" in rec.reason, (kind, rec.reason)
    assert torch.Tag.cudagraph_unsafe in torch.ops.overlap.moe_experts_backward.default.tags
