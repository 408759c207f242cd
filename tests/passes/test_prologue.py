"""Prologue hoist: row-wise ops between an all-gather and its matmuls move onto the shard.

- exact graphs on the fake group: RMSNorm (gather along the sequence; its weight folded into the
  matmuls' weights), LayerNorm without affine (``var_mean``) and a float32 → bfloat16 cast become
  ``ops on the shard → ag_mm``, with nothing left after the gather; the summary names the moved nodes;
- LayerNorm's weight and bias folded into the matmul's weight and bias;
- what stays and why: a gathered value saved for backward, a gather along the last dim, an operand
  that varies along the gather dim or may differ between ranks and is no column vector, a shift
  before a scale, a chain with two ends, a scaled value read by more than the matmuls;
- compiled vs eager on 2 gloo ranks (inference and a training step), random inputs and norm weights
  that differ between the ranks (moved before the gather, each rank's own weight would reach the
  other's rows: the fold keeps this rank's weight on every row, as the graph has it).
"""

from __future__ import annotations

import json
import operator

import pytest
import torch
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

from overlap_backend import make_backend

all_gather = getattr(funcol, "all_gather_single", funcol.all_gather_tensor)
aten = torch.ops.aten
c10d = torch.ops._c10d_functional


def _compile(fn, *args, **kw):
    backend = make_backend(inductor=False, **kw)
    out = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return backend, out


def _op(graph):
    (node,) = [n for n in graph.nodes if n.target is torch.ops.overlap.ag_mm.default]
    return node


def _records(backend):
    return [m for r in backend.reports for m in r.matches if m.pass_name == "ag_mm"]


def _gather_free_ancestors(node):
    """The ops that compute ``node``; asserts none is a collective (they ran on the shard)."""
    from overlap_backend.passes.common import ancestors

    up = ancestors(node) | {node}
    assert not [n for n in up if n.op == "call_function" and n.target in (c10d.all_gather_into_tensor.default,
                                                                         c10d.wait_tensor.default)]
    return {n.target for n in up if n.op == "call_function"}


def test_rms_norm_after_a_sequence_gather_moves_onto_the_shard(fake_pg, capture, clean_env, tmp_path):
    def f(x, nw, wq, wk):
        g = all_gather(x, 1, fake_pg)
        h = F.rms_norm(g, (g.shape[-1],), nw, 1e-6)
        return F.linear(h, wq), F.linear(h, wk)

    x, nw = torch.randn(2, 3, 8), torch.randn(8)
    be, _ = _compile(f, x, nw, torch.randn(16, 8), torch.randn(4, 8), debug_dir=str(tmp_path))
    g = be.graphs[0]
    op = _op(g)
    assert op.args[3] == 1 and len(op.args[1]) == 2  # gather dim 1, both projections in one op
    assert tuple(op.args[0].meta["val"].shape) == (2, 3, 8)  # the shard's shape: the norm ran on it
    assert {aten.rsqrt.default, aten.mean.dim, aten.mul.Tensor} <= _gather_free_ancestors(op.args[0])
    assert not [n for n in g.nodes if n.target in (c10d.all_gather_into_tensor.default, aten.rsqrt.default)
                and op in n.all_input_nodes]
    (rec,) = _records(be)
    assert rec.applied and {"pow_1", "mean", "rsqrt", "mul"} <= set(rec.prologue["moved_before_gather"])
    # the norm weight (a graph input, maybe different per rank) is not moved: folded into wq and wk
    assert rec.prologue["folded_into_weights"] == "mul_1 (* arg1_1)"
    for w in op.args[1]:
        assert aten.mul.Tensor in _gather_free_ancestors(w) and "arg1_1" in {n.name for n in w.all_input_nodes
                                                                          for n in [n, *n.all_input_nodes]}
    summary = json.loads((tmp_path / "rank1" / "summary.json").read_text())
    (m,) = [m for m in summary["graphs"][0]["matches"] if m["pass"] == "ag_mm"]
    assert m["prologue"] == rec.prologue and "rsqrt" in m["nodes"]


def test_layer_norm_var_mean_moves_onto_the_shard(fake_pg, capture, clean_env):
    def f(x, w, b):
        return F.linear(F.layer_norm(all_gather(x, 0, fake_pg), (8,)), w, b)

    be, out = _compile(f, torch.randn(4, 8), torch.randn(16, 8), torch.randn(16))
    op = _op(be.graphs[0])
    assert aten.var_mean.correction in _gather_free_ancestors(op.args[0])
    assert out.shape == (16, 16)


def test_layer_norm_weight_and_bias_fold_into_the_matmul(fake_pg, capture, clean_env):
    """LayerNorm's weight and bias (graph inputs, maybe different per rank) do not move: the weight
    folds into the matmul's weight, the bias into its bias (``b @ W``)."""
    def f(x, nw, nb, w):
        return F.linear(F.layer_norm(all_gather(x, 0, fake_pg), (8,), nw, nb), w)

    be, _ = _compile(f, torch.randn(4, 8), torch.randn(8), torch.randn(8), torch.randn(16, 8))
    (rec,) = _records(be)
    assert rec.applied
    assert rec.prologue["folded_into_weights"] == "mul_1 (* arg1_1)"
    assert rec.prologue["folded_into_biases"] == "add_1 (+ arg2_1 @ weight)"
    op = _op(be.graphs[0])
    (bias,) = op.args[2]
    assert aten.mm.default in _gather_free_ancestors(bias)


def test_a_shift_before_a_scale_stays(fake_pg, capture, clean_env):
    def f(x, nb, nw, w):
        return ((all_gather(x, 0, fake_pg) + nb) * nw) @ w.t()

    be, _ = _compile(f, torch.randn(4, 8), torch.randn(8), torch.randn(8), torch.randn(16, 8))
    (rec,) = _records(be)
    assert not rec.applied and "follows the per-column add: only casts may" in rec.reason, rec.reason


def test_scaled_value_read_elsewhere_stays(fake_pg, capture, clean_env):
    def f(x, nw, w):
        h = F.rms_norm(all_gather(x, 0, fake_pg), (8,), nw, 1e-6)
        return h @ w.t(), h  # h itself is an output: the op would gather it unscaled

    be, _ = _compile(f, torch.randn(4, 8), torch.randn(8), torch.randn(16, 8))
    (rec,) = _records(be)
    assert not rec.applied and "its per-column mul_1 can only be folded into the matmuls" in rec.reason, rec.reason


def test_cast_moves_before_the_gather_and_halves_what_it_ships(fake_pg, capture, clean_env):
    def f(x, w):
        return all_gather(x, 0, fake_pg).to(torch.bfloat16) @ w

    be, out = _compile(f, torch.randn(4, 8), torch.randn(8, 6).bfloat16())
    op = _op(be.graphs[0])
    assert op.args[0].target is torch.ops.prims.convert_element_type.default
    assert op.args[0].meta["val"].dtype == torch.bfloat16  # the op gathers bfloat16
    assert out.dtype == torch.bfloat16 and out.shape == (16, 6)


def test_gathered_value_read_elsewhere_stays_with_the_reason(fake_pg, capture, clean_env):
    def f(x, nw, w):
        g = all_gather(x, 0, fake_pg)
        return F.linear(F.rms_norm(g, (8,), nw, 1e-6), w), g.sum()  # g itself is needed too

    be, _ = _compile(f, torch.randn(4, 8), torch.randn(8), torch.randn(16, 8))
    (rec,) = _records(be)
    assert not rec.applied
    assert "cannot move before the gather: the gathered value" in rec.reason
    assert "also read by sum_1: sum_1 (aten.sum.default) is not a row-wise op" in rec.reason, rec.reason
    assert not [n for n in be.graphs[0].nodes if n.target is torch.ops.overlap.ag_mm.default]


def test_training_graph_saving_the_gathered_input_keeps_its_form(fake_pg, capture, clean_env):
    def f(x, nw, w):
        return F.linear(F.rms_norm(all_gather(x, 0, fake_pg), (8,), nw, 1e-6), w)

    x, nw, w = (torch.randn(4, 8, requires_grad=True), torch.randn(8, requires_grad=True),
                torch.randn(16, 8, requires_grad=True))
    be = make_backend(inductor=False)
    torch.compile(f, backend=be)(x, nw, w).sum().backward()
    fwd = [m for r in be.reports if r.kind == "forward" for m in r.matches if m.pass_name == "ag_mm"]
    assert not fwd[0].applied and "a training graph saves it for backward" in fwd[0].reason


@pytest.mark.parametrize("case, why", [
    ("last_dim", "gathered along its last dim"),
    ("varying", "varies along the gather dim"),
    ("rank_local", "a tensor that may differ between ranks"),
    ("two_ends", "2 values leave the row-wise ops"),
])
def test_what_does_not_commute_with_the_gather_stays(case, why, fake_pg, capture, clean_env):
    def last_dim(x, p, w):
        return F.rms_norm(all_gather(x, 1, fake_pg), (32,), None, 1e-6) @ w.t()

    def varying(x, p, w):  # p has a row per gathered row: it would need gathering itself
        return (all_gather(x, 0, fake_pg) + p) @ w[:, :8].t()

    def two_ends(x, p, w):
        h = all_gather(x, 0, fake_pg) * 2.0
        return h @ w[:, :8].t(), torch.tanh(h * 3.0).sum(0)  # tanh is row-wise, sum(0) is not

    def rank_local(x, p, w):  # a 0-d tensor from a graph input: may differ per rank, and no column vector
        return (all_gather(x, 0, fake_pg) * p[0, 0]) @ w[:, :8].t()

    fn = {"last_dim": last_dim, "varying": varying, "two_ends": two_ends, "rank_local": rank_local}[case]
    x = torch.randn(4, 8)
    be, _ = _compile(fn, x, torch.randn(16, 8), torch.randn(16, 32))
    (rec,) = _records(be)
    assert not rec.applied and why in rec.reason, rec.reason


def test_a_gather_dim_constant_operand_made_from_constants_moves(fake_pg, capture, clean_env):
    """A [B, 1, K] per-batch scale broadcasts along the gathered sequence, and computed in the graph
    from constants alone it is the same on every rank: it moves before the gather with the rest."""
    def f(x, w):
        g = all_gather(x, 1, fake_pg)
        scale = torch.sigmoid(torch.arange(16, dtype=torch.float32, device=x.device).view(2, 1, 8))
        return (g * scale) @ w

    be, out = _compile(f, torch.randn(2, 3, 8), torch.randn(8, 5))
    op = _op(be.graphs[0])
    assert {aten.sigmoid.default, aten.arange.start_step} & _gather_free_ancestors(op.args[0])
    (rec,) = _records(be)
    assert "folded_into_weights" not in rec.prologue
    assert out.shape == (2, 12, 5)


def test_dynamic_shapes_size_readers_follow_the_gathered_end(fake_pg, capture, clean_env):
    """With dynamic shapes the graph reads the gathered value's sizes (``sym_size``) for its views:
    sizes, not the value, so the hoist goes ahead and they read the gathered end (same shape); the
    folds write no symbolic size into the graph."""
    nw, nb, w = torch.randn(16), torch.randn(16), torch.randn(8, 16)

    def f(x):
        return F.linear(F.layer_norm(all_gather(x, 1, fake_pg), (16,), nw, nb), w)

    be = make_backend(inductor=False)
    compiled = torch.compile(f, backend=be, dynamic=True)
    for s in (3, 5):
        assert compiled(torch.randn(2, s, 16)).shape == (2, 4 * s, 8)
    (rec,) = _records(be)
    assert rec.applied and rec.prologue["folded_into_biases"].endswith("@ weight)")
    g = be.graphs[0]
    sizes = [n for n in g.nodes if n.target is aten.sym_size.int]
    assert sizes and all(n.args[0].target is operator.getitem for n in sizes)  # the op's gathered output


# ---------------------------------------------------------------------- compiled vs eager, gloo
def numerics_worker(rank, ws):
    import torch
    import torch.distributed as dist

    import overlap_backend

    group = dist.group.WORLD
    gen = torch.Generator().manual_seed(11)
    K, S = 32, 6

    def rnd(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=gen).to(dtype)

    # per-rank norm weights: the rewrite must keep this rank's weight on every gathered row
    nw, nb = rnd(K) + rank, rnd(K) - rank
    wq, wk, wv = rnd(24, K), rnd(8, K), rnd(8, K)
    wb, b = rnd(K, 16).bfloat16(), rnd(40).bfloat16()
    x3 = rnd(2, S * ws, K).chunk(ws, 1)[rank].contiguous()
    x2 = rnd(S * ws, K).chunk(ws, 0)[rank].contiguous()

    def rms_qkv(x):
        h = F.rms_norm(all_gather(x, 1, group), (K,), nw, 1e-6)
        return torch.cat([F.linear(h, wq), F.linear(h, wk), F.linear(h, wv)], -1)

    def ln_bias(x):
        return F.linear(F.layer_norm(all_gather(x, 0, group), (K,)), torch.cat([wq, wv, wk])[:40], b.float())

    def ln_affine(x):  # weight and bias folded into the matmul's weight and bias
        return F.linear(F.layer_norm(all_gather(x, 0, group), (K,), nw, nb), torch.cat([wq, wv, wk])[:40], b.float())

    def ln_gelu(x):  # a prologue before the matmul and an epilogue (bias, GELU) after it, in one op
        return F.gelu(F.linear(F.layer_norm(all_gather(x, 0, group), (K,), nw, nb), wq) + b[:24].float())

    def ln_affine_seq(x):  # gathered along the sequence
        return F.linear(F.layer_norm(all_gather(x, 1, group), (K,), nw, nb), wq)

    def rms_bf16(x):  # bfloat16: the norm in float32 between two casts, the weight before the last
        h = F.rms_norm(all_gather(x, 1, group), (K,), nw.bfloat16(), 1e-6)
        return F.linear(h, wq.bfloat16())

    def cast(x):
        return all_gather(x, 0, group).to(torch.bfloat16) @ wb

    results = {}
    for name, fn, x, tol in (("rms_qkv", rms_qkv, x3, 1e-4), ("ln_bias", ln_bias, x2, 1e-4),
                             ("ln_affine", ln_affine, x2, 1e-4), ("ln_gelu", ln_gelu, x2, 1e-4),
                             ("cast", cast, x2, 1e-2),
                             ("rms_bf16", rms_bf16, x3.bfloat16(), 1e-2)):
        torch._dynamo.reset()
        with torch.no_grad():
            ref = fn(x)
            backend = overlap_backend.make_backend(lowering="p2p")
            got = torch.compile(fn, backend=backend)(x)
        moved = [m.prologue for r in backend.reports for m in r.matches if m.applied and m.prologue]
        epilogues = [e["spec"] for r in backend.reports for m in r.matches if m.epilogue for e in m.epilogue]
        if name == "ln_gelu":
            assert epilogues == ["bias:0,gelu"], epilogues
        results[name] = (_rel(got, ref), tol, len(moved))

    # a training step through the cast: the forward's gathered bfloat16 value is saved for backward
    torch._dynamo.reset()
    w = rnd(K, 16, dtype=torch.bfloat16).requires_grad_()
    xs = x2.clone().requires_grad_()

    def step(x, w):
        return (all_gather(x, 0, group).to(torch.bfloat16) @ w).float().square().mean()

    loss_ref = step(xs, w)
    loss_ref.backward()
    grads_ref = (xs.grad.clone(), w.grad.clone())
    xs.grad, w.grad = None, None
    backend = overlap_backend.make_backend(lowering="p2p")
    loss = torch.compile(step, backend=backend)(xs, w)
    loss.backward()
    moved = [m.prologue for r in backend.reports if r.kind == "forward" for m in r.matches if m.applied and m.prologue]
    errs = [_rel(loss.detach(), loss_ref.detach()), _rel(xs.grad, grads_ref[0]), _rel(w.grad, grads_ref[1])]
    results["cast_training"] = (max(errs), 1e-2, len(moved))

    # dynamic shapes: one compile serves two sequence lengths
    torch._dynamo.reset()
    backend = overlap_backend.make_backend(lowering="p2p")
    compiled = torch.compile(ln_affine_seq, backend=backend, dynamic=True)
    errs = []
    for s in (S, S + 2):
        x = rnd(2, s, K)
        with torch.no_grad():
            errs.append(_rel(compiled(x), ln_affine_seq(x)))
    moved = [m.prologue for r in backend.reports for m in r.matches if m.applied and m.prologue]
    results["ln_affine_dynamic"] = (max(errs), 1e-4, len(moved))
    return results


def _rel(a, b):
    a, b = a.double(), b.double()
    assert not torch.isnan(a).any(), "NaN in the output"
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.mark.timeout(300)
def test_hoisted_prologues_match_eager_on_gloo(clean_env):
    from dist_harness import run_ranks

    for rank, res in enumerate(run_ranks(numerics_worker, 2, timeout=280)):
        for name, (err, tol, moved) in res.items():
            assert moved == 1, f"rank {rank} {name}: {moved} ops had a prologue moved before the gather"
            assert err <= tol, f"rank {rank} {name}: rel err {err:.3e} > {tol}"


# ------------------------------------------------------------------------------- the cost model
def test_cost_model_charges_the_plain_prologue_and_the_rewrite_its_folds():
    from overlap_backend.calibrate import DEFAULTS
    from overlap_backend.passes.cost_model import Problem, mem_ms, predict

    cal = DEFAULTS["h200"]
    plain = Problem("ag_mm", m=8192, n=3072, k=4096, dtype="bfloat16", ws=4)
    pro = dict(prologue_bytes=8192 * 4096 * 4, fold_bytes=2 * 4096 * 3072 * 2, folds=1)
    a, b = predict(plain, cal, ["symm"]), predict(Problem(**{**plain.__dict__, **pro}), cal, ["symm"])
    assert b.baseline_ms - a.baseline_ms == pytest.approx(mem_ms(cal, pro["prologue_bytes"]))
    moved = mem_ms(cal, pro["prologue_bytes"] / 4) + mem_ms(cal, pro["fold_bytes"]) + cal.launch_ms
    assert b.best.ms - a.best.ms == pytest.approx(moved) and b.best.terms["prologue_ms"] == pytest.approx(moved)
    assert b.problem.to_json()["folds"] == 1


def test_the_pass_prices_the_prologue(fake_pg, capture, clean_env):
    clean_env.setenv("OVERLAP_COST_MODEL", "on")

    def f(x, nw, nb, w):
        return F.linear(F.layer_norm(all_gather(x, 0, fake_pg), (8,), nw, nb), w)

    be, _ = _compile(f, torch.randn(4, 8), torch.randn(8), torch.randn(8), torch.randn(16, 8))
    (rec,) = _records(be)
    problem = rec.cost["problem"]
    # gathered [16, 8] float32 read, its end written; the weight [8, 16] read and written (scale) and read (shift)
    assert (problem["prologue_bytes"], problem["fold_bytes"], problem["folds"]) == (16 * 8 * 8, 3 * 8 * 16 * 4, 2)


# ------------------------------------------------------------------------------- the benchmark
@pytest.mark.timeout(300)
def test_bench_prologue_cpu_smoke(tmp_path):
    """bench/suites/bench_prologue.py on 2 gloo ranks: every variant checked against eager and timed, the
    prologue moved and the norm's weight (and LayerNorm's bias) folded, the table and JSON written."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "bench/suites/bench_prologue.py", "--device", "cpu", "--rounds", "1", "--out-dir", str(tmp_path)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVERLAP_")}
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "prologue_ws2.json").read_text())["rows"]
    assert {(r["norm"], r["variant"]) for r in rows} == {
        (n, v) for n in ("rms", "layer") for v in ("eager", "overlap", "overlap_symm", "overlap_p2p")}
    for r in rows:
        assert r["status"] == "ok" and r["time_ms"] > 0, r
        if r["variant"] != "eager":
            assert "moved" in r["rewrites"] and "folded mul_1" in r["rewrites"], r
            assert ("add_1 (+ arg2_1 @ weight)" in r["rewrites"]) == (r["norm"] == "layer"), r
