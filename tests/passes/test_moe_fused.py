"""The ``moe`` pass on experts whose gate and up projections are one GEMM on a fused weight.

Each case is the reference layer (``MoELayer(fused_gate_up=...)``) compiled with the backend on 2 gloo
ranks (cost model off, ``OVERLAP_DEBUG_DIR`` set): the forward block and the backward's expert
gradients are rewritten (read from each rank's ``summary.json``) and the output and every gradient
match eager. The cases cover the three GEMM forms, both weight layouts (``[E, H, 2F]`` and
transformers' ``[E, 2F, H]`` through ``F.linear``), either half first, ``chunk`` and slices, and
transformers' float32 grouped GEMM (``transformers::grouped_mm_fallback``), two of them also with
Inductor. All cases run in one process group.
"""

import json
from pathlib import Path

import pytest
import torch

from dist_harness import run_ranks
from test_moe import graphs  # noqa: F401 - the fixture: rewritten graphs kept, moe_experts as a shape stub

# (policy, expert_form, fused_gate_up, linear_weights, gate_up_split)
CASES = [
    ("capacity", "bmm", "gate_up", False, "chunk"),
    ("capacity", "bmm", "up_gate", True, "slice"),
    ("dropless", "grouped_mm", "gate_up", True, "chunk"),
    ("dropless", "grouped_mm", "up_gate", False, "slice"),
    ("capacity", "loop", "gate_up", True, "chunk"),  # transformers' eager experts: F.linear(x, W[e]).chunk(2, -1)
    ("dropless", "loop", "up_gate", False, "chunk"),
    ("dropless", "fallback", "gate_up", True, "chunk"),  # transformers' grouped_mm_fallback (float32), ACT2FN
    ("capacity", "matmul", "up_gate", True, "chunk"),  # x @ W: bmm between views and expands
    ("dropless", "einsum", "gate_up", False, "slice"),  # einsum: bmm between unsqueezes, permutes and views
    ("capacity", "einsum", None, False, "chunk"),  # (separate gate and up weights)
]
# compiled with Inductor too (its partitioner decides what the backward reads: the fused GEMM's output or
# its halves; the ops' weight arguments are slices of graph inputs)
INDUCTOR_CASES = [("capacity", "bmm", "up_gate", True, "chunk"), ("dropless", "loop", "gate_up", True, "chunk")]


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _fallback_layer_class():
    """The reference layer with its grouped GEMMs as transformers runs them under torch.compile for a
    float32 weight, ``transformers::grouped_mm_fallback(input, weight, offs)``, and its activation
    module ``ACT2FN["silu"]``."""
    import transformers.integrations.moe  # noqa: F401 - registers transformers::grouped_mm_fallback
    from transformers.activations import ACT2FN

    from overlap_backend.models.moe import MoELayer

    gmm = torch.ops.transformers.grouped_mm_fallback

    class FallbackMoELayer(MoELayer):
        act_fn = ACT2FN["silu"]

        def _grouped_experts(self, x, offs):
            w_gu, w_down = self._stacked_weights()
            gate, up = gmm(x, w_gu, offs).chunk(2, dim=-1)  # (fused_gate_up="gate_up")
            return gmm(self.act_fn(gate) * up, w_down, offs)

    return FallbackMoELayer


def _written_layer_class(how: str):
    """The reference layer with its batched expert GEMMs written as ``x @ w`` or ``torch.einsum``."""
    import torch.nn.functional as F

    from overlap_backend.models.moe import MoELayer

    def mm(x, w):
        return x @ w if how == "matmul" else torch.einsum("enh,ehf->enf", x, w)

    class WrittenMoELayer(MoELayer):
        def _bmm_experts(self, x):
            if self.fused_gate_up is None:
                return mm(F.silu(mm(x, self.w_gate)) * mm(x, self.w_up), self.w_down)
            w_gu, w_down = self._stacked_weights()
            return mm(self._act(mm(x, w_gu)), w_down)

    return WrittenMoELayer


@torch._dynamo.config.patch(capture_scalar_outputs=True)  # dropless: .tolist() of the split sizes
def fused_worker(rank, ws, cases, inductor_cases, debug_root):
    import os

    import overlap_backend
    from overlap_backend.models.moe import MoELayer

    tokens, hidden, ffn, experts = 6, 16, 32, 2 * ws
    x = torch.randn(ws, tokens, hidden, generator=torch.Generator().manual_seed(5))[rank]
    probe = torch.cos(torch.arange(tokens * hidden, dtype=torch.float32)).view(tokens, hidden)

    def build(policy, form, fused, linear, split):
        if form == "fallback":
            cls, form = _fallback_layer_class(), "grouped_mm"
        elif form in ("matmul", "einsum"):
            cls, form = _written_layer_class(form), "bmm"
        else:
            cls = MoELayer
        return cls(hidden, ffn, experts, top_k=2, policy=policy, expert_form=form, capacity_factor=1.0, seed=3,
                   fused_gate_up=fused, linear_weights=linear, gate_up_split=split)

    def step(model):
        xi = x.clone().requires_grad_()
        out = model(xi)
        (out * probe).sum().backward()
        return [out, xi.grad] + [p.grad for p in model.parameters()]

    results = {}
    runs = [(case, False) for case in cases] + [(case, True) for case in inductor_cases]
    for i, (case, inductor) in enumerate(runs):
        torch._dynamo.reset()
        os.environ["OVERLAP_DEBUG_DIR"] = os.path.join(debug_root, str(i))  # read by make_backend
        ref = step(build(*case))
        backend = overlap_backend.make_backend(inductor=inductor, cost_model="off")
        got = step(torch.compile(build(*case), backend=backend, fullgraph=True))
        results[(case, inductor)] = {"errs": [_rel(g, r) for g, r in zip(got, ref)], "ref_norm": ref[0].norm().item()}
    return results


@pytest.fixture(scope="module")
def fused_runs(tmp_path_factory):
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("moe_fused")
    per_rank = run_ranks(fused_worker, 2, CASES, INDUCTOR_CASES, str(root), timeout=500,
                         env={"OVERLAP_COST_MODEL": "off"})
    runs = [(case, False) for case in CASES] + [(case, True) for case in INDUCTOR_CASES]
    summaries = {run: [json.loads((Path(root) / str(i) / f"rank{r}" / "summary.json").read_text()) for r in range(2)]
                 for i, run in enumerate(runs)}
    return per_rank, summaries


def _moe_decisions(summary):
    return [(g["kind"], m["applied"], m["reason"]) for g in summary["graphs"] for m in g["matches"]
            if m["pass"] == "moe"]


@pytest.mark.timeout(520)
@pytest.mark.parametrize("case,inductor", [(c, False) for c in CASES] + [(c, True) for c in INDUCTOR_CASES],
                         ids=lambda c: "-".join(str(x) for x in c) if isinstance(c, tuple) else ("inductor" if c else
                                                                                                  "fx"))
def test_fused_gate_up_rewritten_and_matches_eager(fused_runs, case, inductor):
    per_rank, summaries = fused_runs
    tol = 1e-2 if case[1] == "grouped_mm" else 1e-4  # (the grouped_mm form runs its GEMMs in bfloat16)
    for rank, res in enumerate(per_rank):
        r = res[(case, inductor)]
        assert r["ref_norm"] > 0, f"rank {rank}: the eager layer returned zeros (the test is vacuous)"
        assert all(e <= tol for e in r["errs"]), f"rank {rank}: rel errors (out, dx, grads) {r['errs']}"
    decisions = [_moe_decisions(s) for s in summaries[(case, inductor)]]
    assert decisions[0] == decisions[1], decisions
    fwd = [d for d in decisions[0] if d[0] == "forward"]
    bwd = [d for d in decisions[0] if d[0] == "backward"]
    assert fwd and all(d[1] for d in fwd), f"forward block not rewritten: {decisions[0]}"
    # (fallback: its one op computing dX and dW is split, dX = grouped_mm_fallback(g, W^T), dW its own op)
    assert bwd and all(d[1] for d in bwd), f"backward expert gradients not rewritten: {decisions[0]}"


# ----------------------------------------------------------------- the rewritten graphs (fake PG)
def _weight_base(n):
    """The tensor a weight argument is a view or cast of (through permute / convert_element_type)."""
    while n.op == "call_function" and n.target in (torch.ops.aten.permute.default,
                                                   torch.ops.prims.convert_element_type.default):
        n = n.args[0]
    return n


def _halves(gate, up, dim):
    """The (start, end) of the gate and up slices, both of one fused tensor along ``dim``."""
    slice_ = torch.ops.aten.slice.Tensor
    assert gate.target is slice_ and up.target is slice_, (gate, up)
    assert gate.args[0] is up.args[0] and gate.args[1] == up.args[1] == dim, (gate.args, up.args)
    return tuple(gate.args[2:4]), tuple(up.args[2:4])


@pytest.mark.parametrize("policy,form,fused,linear", [
    ("capacity", "bmm", "up_gate", False),
    ("dropless", "grouped_mm", "gate_up", True),
    ("dropless", "loop", "gate_up", True),
    ("capacity", "loop", "up_gate", False),
])
def test_op_reads_the_fused_weight_in_place(fake_pg, graphs, policy, form, fused, linear):
    """Forward and backward ops get the two halves of the fused weight as slices of the parameter (the
    loop's per-expert selects folded back into it, no stacked copy), in the layer's half order; the
    forward's expert GEMMs are gone."""
    from test_moe import WS, _moe_records, _only

    from overlap_backend import make_backend
    from overlap_backend.models.moe import MoELayer

    torch.manual_seed(0)
    layer = MoELayer(16, 32, 2 * WS, top_k=2, policy=policy, expert_form=form, capacity_factor=1.0,
                     fused_gate_up=fused, linear_weights=linear)
    be = make_backend(inductor=False)
    torch.compile(layer, backend=be, fullgraph=True)(torch.randn(6, 16, requires_grad=True)).sum().backward()
    recs = _moe_records(be)
    assert [r.applied for r in recs] == [True, True], [(r.applied, r.reason) for r in recs]
    f = 32
    gate_at, up_at = ((0, f), (f, 2 * f)) if fused == "gate_up" else ((f, 2 * f), (0, f))
    fwd, bwd = be.graphs
    op = _only(fwd, torch.ops.overlap.moe_experts.default)
    wg, wu, wd = op.args[6:9]
    assert _halves(wg, wu, 2) == (gate_at, up_at)
    assert _weight_base(wg.args[0]).op == "placeholder" and _weight_base(wd).op == "placeholder"
    assert not any(n.target in (torch.ops.aten.cat.default, torch.ops.aten.unsqueeze.default)
                   for n in (wg.args[0], wd))
    ts = [n.target for n in fwd.nodes]
    assert torch.ops.aten.bmm.default not in ts and torch.ops.aten._grouped_mm.default not in ts
    assert ts.count(torch.ops.aten.mm.default) == 1  # the router
    op = _only(bwd, torch.ops.overlap.moe_experts_backward.default)
    wt_gate, wt_up, wt_down = op.args[8:11]
    assert _halves(wt_gate, wt_up, 1) == (gate_at, up_at)
    assert _weight_base(wt_gate.args[0]).op == "placeholder" and _weight_base(wt_down).op == "placeholder"
    assert all(p.grad is not None and p.grad.shape == p.shape for p in layer.parameters())
