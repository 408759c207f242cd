"""Graphs with collectives compile with Inductor settings that make every rank hand the passes the same
graph: shape padding (``pad_mm``, which times padded against plain matmuls on each rank's GPU and then
rewrites ``mm`` into ``mm(cat) -> slice``, hiding it from the matchers) is off there, whatever the
user's ``options`` say; graphs without collectives and ``OVERLAP_DISABLE`` compile as Inductor would."""

from __future__ import annotations


def _spy_patches(monkeypatch) -> list[dict]:
    import torch._inductor.compile_fx as cfx

    seen: list[dict] = []

    def spy(gm, example_inputs, **kwargs):
        seen.append(dict(kwargs.get("config_patches") or {}))
        return gm.forward

    monkeypatch.setattr(cfx, "compile_fx", spy)
    return seen


def test_shape_padding_off_for_graphs_with_collectives(fake_pg, clean_env, monkeypatch):
    import torch
    import torch.distributed._functional_collectives as funcol

    from overlap_backend import backend as backend_mod

    seen = _spy_patches(monkeypatch)
    gather = getattr(funcol, "all_gather_single", funcol.all_gather_tensor)
    x, w = torch.randn(6, 8), torch.randn(8, 8)

    torch.compile(lambda x, w: gather(x, 0, fake_pg) @ w, backend=backend_mod.make_backend())(x, w)
    torch._dynamo.reset()
    # a user's shape_padding=True would let each rank's timings decide the graph the passes see
    torch.compile(lambda x, w: gather(x, 0, fake_pg) @ w, backend=backend_mod.make_backend(),
                  options={"shape_padding": True, "max_autotune": False})(x, w)
    torch._dynamo.reset()
    torch.compile(lambda x, w: torch.relu(x @ w), backend=backend_mod.make_backend())(x, w)
    torch._dynamo.reset()
    torch.compile(lambda x, w: gather(x, 0, fake_pg) @ w, backend=backend_mod.make_backend(disable=True),
                  options={"shape_padding": True})(x, w)

    with_collective, with_options, without_collective, disabled = seen
    assert with_collective["shape_padding"] is False, with_collective
    assert with_options["shape_padding"] is False and with_options["max_autotune"] is False, with_options
    assert "shape_padding" not in without_collective, without_collective
    assert disabled == {"shape_padding": True}, disabled  # plain Inductor: untouched
