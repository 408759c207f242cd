"""Real models end to end on 2 gloo ranks: the Llama decoder with TP + SP through DTensor,
the Mixtral-style MoE decoder with expert parallelism, and the serving loop.

Each test trains (or serves) the same model twice from the same seed, eagerly and compiled with
the overlap backend (``OVERLAP_INDUCTOR=0``: AOTAutograd + the passes, no C++ codegen), and checks
the loss curves (float32: relative 1e-4) or the greedy tokens (equal), and that the passes rewrote
what they must in the forward AND backward graphs, with the same decisions on every rank.
"""

import pytest

from dist_harness import run_ranks

FP32_TOL = 1e-4
STEPS = 5


def _decisions(backend):
    return [(r.kind, m.pass_name, m.applied, m.reason) for r in backend.reports for m in r.matches]


def _tiny_llama(**kw):
    from overlap_backend.models.llama import LlamaConfig

    return LlamaConfig(**{**dict(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64,
                                 seq_len=32), **kw})


# ------------------------------------------------------------------------ Llama TP + SP training
def llama_train_worker(rank, ws, per_block, n_layers, steps):
    from torch.distributed.device_mesh import init_device_mesh

    import overlap_backend
    from overlap_backend.models.llama import build_llama, compile_llama
    from overlap_backend.examples.train import train

    mesh = init_device_mesh("cpu", (ws,))
    cfg = _tiny_llama(n_layers=n_layers)
    kw = dict(steps=steps, batch=2, seq_len=8 * ws, vocab=cfg.vocab_size, lr=1e-2, seed=0)
    single = train(build_llama(cfg, None, seed=0), **kw) if per_block else None  # one device, no TP
    eager = train(build_llama(cfg, mesh, seed=0), **kw)
    backend = overlap_backend.make_backend()
    model = compile_llama(build_llama(cfg, mesh, seed=0), backend, per_block=per_block)
    got = train(model, **kw)
    norm = model.layers[0].attention_norm.weight  # a sequence-parallel parameter: Partial gradient
    return {"single": single, "eager": eager, "got": got, "decisions": _decisions(backend),
            "norm_grad_placement": str(norm.grad.placements)}


def _matched(decisions, kind, pass_name):
    return [d for d in decisions if d[0] == kind and d[1] == pass_name and d[2]]


def _check_curves(per_rank, steps=STEPS, tol=FP32_TOL):
    for rank, r in enumerate(per_rank):
        assert len(r["got"]) == len(r["eager"]) == steps
        rel = [abs(a - b) / abs(b) for a, b in zip(r["got"], r["eager"])]
        assert all(e <= tol for e in rel), f"rank {rank}: losses {r['got']} vs eager {r['eager']} (rel {rel})"
        assert r["eager"][-1] < r["eager"][0], f"the loss did not fall: {r['eager']}"  # the run trains
        assert r["decisions"] == per_rank[0]["decisions"], f"rank {rank} decided differently"
        if r.get("single") is not None:  # the parallel model is the one-device model
            rel = [abs(a - b) / abs(b) for a, b in zip(r["eager"], r["single"])]
            assert all(e <= tol for e in rel), f"rank {rank}: parallel eager {r['eager']} vs one device {r['single']}"


def _only_expected_rejections(decisions):
    """Everything is rewritten but the embedding's reduce-scatter / its backward all-gather and the
    gather of the logits (no matmul there)."""
    for d in decisions:
        if not d[2]:
            assert "not produced by a matmul" in d[3] or "no matmul takes the gathered tensor" in d[3], d


@pytest.mark.timeout(180)
def test_llama_tp_sp_training_matches_eager():
    """Per-block compile (torchtitan's way), 2 layers, 5 AdamW steps: losses == eager == one device."""
    per_rank = run_ranks(llama_train_worker, 2, True, 2, STEPS, timeout=170)
    _check_curves(per_rank)
    dec = per_rank[0]["decisions"]
    assert per_rank[0]["norm_grad_placement"].startswith("(Partial")
    # one block graph (shared by the layers) forward and backward, and the embedding's graphs
    assert [d[0] for d in dec if d[1] == "ag_mm"] == ["forward"] * 2 + ["backward"] * 3, dec
    for kind in ("forward", "backward"):
        assert len(_matched(dec, kind, "ag_mm")) == 2, (kind, dec)  # before attention, before the MLP
        assert len(_matched(dec, kind, "mm_rs")) == 2, (kind, dec)  # after wo/w2; Q/K/V and w1/w3 sums
    _only_expected_rejections(dec)


@pytest.mark.timeout(180)
def test_llama_whole_model_compile_matches_eager():
    """One graph for the whole model (1 layer): the head's gather and its backward scatter too."""
    per_rank = run_ranks(llama_train_worker, 2, False, 1, 3, timeout=170)
    _check_curves(per_rank, steps=3)
    dec = per_rank[0]["decisions"]
    # forward: gathers before attention, the MLP and the head; scatters after wo and w2.
    # backward: gathers of wo's and w2's output gradients; scatters of the head's, the w1/w3 and
    # the Q/K/V input gradients
    expected = {("forward", "ag_mm"): 3, ("forward", "mm_rs"): 2, ("backward", "ag_mm"): 2, ("backward", "mm_rs"): 3}
    for (kind, name), n in expected.items():
        assert len(_matched(dec, kind, name)) == n, (kind, name, dec)
    _only_expected_rejections(dec)


# --------------------------------------------------------------------------- Mixtral EP training
def mixtral_train_worker(rank, ws):
    import dataclasses
    import functools

    import torch.distributed as dist

    import overlap_backend
    from overlap_backend.models.llama import compile_llama
    from overlap_backend.models.mixtral import MixtralConfig, build_mixtral, sync_dense_grads
    from overlap_backend.examples.train import train

    # capacity = every token a rank routes: nothing is dropped, so EP equals one device
    cfg = MixtralConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, seq_len=16,
                        num_experts=2 * ws, top_k=2, expert_form="bmm", capacity_factor=float(ws))
    kw = dict(steps=STEPS, seq_len=8, vocab=cfg.vocab_size, lr=1e-2, seed=0)

    def run(compiled):
        model = build_mixtral(cfg, seed=0)
        backend = None
        if compiled:
            backend = overlap_backend.make_backend()
            compile_llama(model, backend, fullgraph=True)
        losses = train(model, batch=2, data_parallel=True, grad_hook=functools.partial(sync_dense_grads, model), **kw)
        return losses, backend

    # one device: every expert local (a group of one rank), the global batch of 2 * ws rows
    solo = [dist.new_group([r]) for r in range(ws)][rank]
    one = dataclasses.replace(cfg, capacity_factor=float(cfg.num_experts))
    single = train(build_mixtral(one, group=solo, seed=0), batch=2 * ws, **kw)
    eager, _ = run(False)
    got, backend = run(True)
    return {"single": single, "eager": eager, "got": got, "decisions": _decisions(backend)}


@pytest.mark.timeout(180)
def test_mixtral_ep_training_matches_eager():
    """Per-block compile, 2 MoE layers, capacity policy, bmm experts: losses == eager == one device;
    the moe pass rewrites the forward (moe_experts) and the backward (moe_experts_backward)."""
    per_rank = run_ranks(mixtral_train_worker, 2, timeout=170)
    _check_curves(per_rank)
    dec = per_rank[0]["decisions"]
    assert _matched(dec, "forward", "moe"), dec
    assert _matched(dec, "backward", "moe"), dec


# ------------------------------------------------------------------------------------ serving
def serve_worker(rank, ws):
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    import overlap_backend
    from overlap_backend.models.llama import build_llama, compile_llama
    from overlap_backend.examples.serve import generate, random_prompts

    mesh = init_device_mesh("cpu", (ws,))
    cfg = _tiny_llama()
    prompts = random_prompts(cfg.vocab_size, 2, 6, seed=1)

    def run(compiled):
        model = build_llama(cfg, mesh, sequence_parallel=False, seed=0)
        model.setup_cache(batch=2, max_seq=16)
        backend = None
        if compiled:
            backend = overlap_backend.make_backend()
            compile_llama(model, backend, dynamic=False)
        first = generate(model, prompts, new_tokens=6)
        again = generate(model, prompts, new_tokens=6)  # the caches are reset: the same tokens
        return first, again, backend

    (eager, _, _), (got, again, backend) = run(False), run(True)
    kinds = [r.kind for r in backend.reports]
    return {"eager": eager.tokens.tolist(), "got": got.tokens.tolist(), "again": again.tokens.tolist(),
            "kinds": kinds, "decisions": _decisions(backend),
            "unique_graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"]}


@pytest.mark.timeout(180)
def test_serving_greedy_tokens_match_eager():
    """TP (no SP) prefill + 6 greedy decode steps with static KV caches: the tokens of eager, of the
    compiled model and of a second compiled run are equal; two block graphs, no recompilation."""
    per_rank = run_ranks(serve_worker, 2, timeout=170)
    r0 = per_rank[0]
    for rank, r in enumerate(per_rank):
        assert r["got"] == r["eager"] == r["again"], (rank, r["got"], r["eager"], r["again"])
        assert r["got"] == r0["got"], "ranks generated different tokens"
        assert r["decisions"] == r0["decisions"]
    # the embedding and one block graph for the prefill, the same for every decode step: no recompilation
    assert r0["kinds"] == ["inference"] * 4, r0["kinds"]
    assert r0["unique_graphs"] == 4, r0["unique_graphs"]
    assert len(_matched(r0["decisions"], "inference", "mm_ar")) == 4, r0["decisions"]  # wo, w2 x 2 graphs
    _only_expected_rejections(r0["decisions"])  # the embedding's all-reduce
