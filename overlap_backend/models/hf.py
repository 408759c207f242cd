"""Hugging Face transformers' expert parallelism in a form the ``moe`` pass rewrites.

transformers' own all-to-all expert parallelism (``AllToAllEP``, what ``ep_implementation="auto"`` runs in
training) reads the split sizes back to the host (``.tolist()``), branches on the received row count and runs the
experts on data-dependent rows: under ``torch.compile`` every MoE layer breaks the graph (see
``docs/models.md``), and the dispatch and combine all-to-alls land in different graphs.

:func:`register_ep_implementation` registers :class:`OverlapAllToAllEP` with transformers'
``EPImplementationInterface`` under :data:`EP_IMPLEMENTATION` (``"overlap_all_to_all"``)::

    from transformers.distributed import DistributedConfig
    from overlap_backend.models.hf import register_ep_implementation

    register_ep_implementation()
    config = DistributedConfig(tp_size=2, ep_size=2, ep_implementation="overlap_all_to_all")

It moves the same tokens as ``AllToAllEP`` (the TP ranks' disjoint slices of the shared batch, each (token, expert)
pair to the expert's rank and back), with static shapes and no branch (GShard's capacity layout, as
``models.moe.MoELayer(policy="capacity")``): every rank sends every expert ``capacity`` rows (zero rows where fewer
tokens chose it), the local experts run as two batched GEMMs on their fused gate/up weight, and the combine
all-to-all brings the rows back. One graph per decoder stack, and the ``moe`` pass rewrites each layer's
dispatch -> experts -> combine (forward) and its experts' input gradients (backward).

The default capacity is the number of tokens of the rank's slice: an expert gets at most one copy of each token
(the top-k experts of a token are distinct), so nothing is dropped and the layer computes what ``AllToAllEP``
computes. ``capacity_factor`` (a class attribute, or :func:`register_ep_implementation`'s argument) sets the
GShard capacity ``ceil(factor * tokens * top_k / experts)`` instead, smaller buffers for dropped tokens.

Experts it runs itself: transformers' fused gate/up experts (``gate_up_proj`` ``[E, 2F, H]``, or ``[E, H, 2F]``
with ``is_transposed``; ``down_proj``; no biases, no post-expert norm), gated by the experts' ``_apply_gate``.
Other experts run through ``AllToAllEP`` (a warning says so).
"""

from __future__ import annotations

import logging
import math

import torch
import torch.distributed._functional_collectives as funcol

log = logging.getLogger(__name__)

EP_IMPLEMENTATION = "overlap_all_to_all"
EXPERT_FORMS = ("bmm", "loop")

# torch 2.13's all_to_all_single has autograd; older releases only through the *_autograd name.
_all_to_all = getattr(funcol, "all_to_all_single_autograd", None) or funcol.all_to_all_single


def unsupported_experts(experts: torch.nn.Module) -> str | None:
    """Why :class:`OverlapAllToAllEP` cannot run ``experts`` itself, or None."""
    if not isinstance(getattr(experts, "gate_up_proj", None), torch.Tensor) or \
            not isinstance(getattr(experts, "down_proj", None), torch.Tensor):
        return "no fused gate_up_proj / down_proj weights"
    for flag, why in (("has_bias", "expert biases"), ("has_post_expert_norm", "a post-expert norm")):
        if getattr(experts, flag, False):
            return why
    if not getattr(experts, "has_gate", True) or not getattr(experts, "is_concatenated", True):
        return "gate and up not one concatenated weight"
    return None


def _ep_base():
    from transformers.distributed.expert_parallel import AllToAllEP, EPImplementation

    return EPImplementation, AllToAllEP


def _make_class():
    EPImplementation, AllToAllEP = _ep_base()

    class OverlapAllToAllEP(EPImplementation):
        """All-to-all expert parallelism with static shapes: capacity dispatch -> batched expert GEMMs -> combine.

        ``capacity_factor``: None (default) sends each expert as many rows as the rank has tokens (nothing
        dropped); a number: GShard's capacity, tokens past it are dropped (contribute zero).
        ``expert_form``: ``"bmm"`` (one batched GEMM per projection over the local experts) or ``"loop"``
        (a ``F.linear`` per local expert, as transformers' eager experts).
        """

        capacity_factor: float | None = None
        expert_form: str = "bmm"

        def __init__(self, experts, ep_mesh, tp_mesh):
            super().__init__(experts, ep_mesh, tp_mesh)
            self.experts = experts
            why = unsupported_experts(experts)
            self.fallback = AllToAllEP(experts, ep_mesh, tp_mesh) if why else None
            if why:
                log.warning("overlap_all_to_all: %s has %s: it runs through transformers' AllToAllEP",
                            type(experts).__name__, why)
            if self.expert_form not in EXPERT_FORMS:
                raise ValueError(f"expert_form={self.expert_form!r}; allowed: {', '.join(EXPERT_FORMS)}")

        def capacity(self, tokens: int, top_k: int) -> int:
            if self.capacity_factor is None:
                return max(1, tokens)
            experts = self.num_local_experts * self.ep_mesh.size()
            return max(1, min(tokens, math.ceil(self.capacity_factor * tokens * top_k / experts)))

        def __call__(self, hidden_states, top_k_index, top_k_weights):
            if self.fallback is not None:
                return self.fallback(hidden_states, top_k_index, top_k_weights)
            from torch.distributed.tensor import DTensor, Replicate, Shard

            num_tokens, h = hidden_states.shape
            tp = self.tp_mesh.size() > 1
            if tp:  # as AllToAllEP: each TP rank keeps its slice (a local chunk; its backward all-gathers)
                hidden_states, top_k_index, top_k_weights = (
                    DTensor.from_local(t, self.tp_mesh, [Replicate()], run_check=False)
                    .redistribute(self.tp_mesh, [Shard(0)]).to_local()
                    for t in (hidden_states, top_k_index, top_k_weights))
            out = self._capacity_moe(hidden_states, top_k_index, top_k_weights)
            if not tp:
                return out
            return DTensor.from_local(out.contiguous(), self.tp_mesh, [Shard(0)], shape=(num_tokens, h),
                                      stride=(h, 1)).full_tensor()

        def _capacity_moe(self, x, top_k_index, top_k_weights):
            ws, el = self.ep_mesh.size(), self.num_local_experts
            e, (t, k), h = ws * el, top_k_index.shape, x.shape[-1]
            cap = self.capacity(t, k)
            flat = top_k_index.reshape(-1)  # [T*k] global expert of each (token, slot)
            x_rep = x.unsqueeze(1).expand(t, k, h).reshape(t * k, h)
            # each assignment's position among its expert's; past the capacity: a spare row never sent
            one_hot = torch.nn.functional.one_hot(flat, e)
            pos = ((one_hot.cumsum(0) - 1) * one_hot).sum(-1)
            slot = torch.where(pos < cap, flat * cap + pos, e * cap)
            buf = x_rep.new_zeros(e * cap + 1, h).index_put((slot,), x_rep, accumulate=True)[: e * cap]

            group = self.ep_mesh.get_group()
            recv = _all_to_all(buf, None, None, group)  # [ws (source), E_local, cap, H]
            xe = recv.view(ws, el, cap, h).transpose(0, 1).reshape(el, ws * cap, h)
            ye = self._experts(xe)  # [E_local, ws * cap, H]
            back = ye.view(el, ws, cap, h).transpose(0, 1).reshape(ws * el * cap, h)
            combined = _all_to_all(back, None, None, group)  # [E, cap, H]: this rank's tokens
            combined = torch.cat([combined, combined.new_zeros(1, h)])  # dropped assignments read zeros
            out_rep = combined[slot].view(t, k, h)
            return (out_rep * top_k_weights.unsqueeze(-1).to(out_rep.dtype)).sum(dim=1)

        def _experts(self, xe):
            experts = self.experts
            w_gu, w_down = experts.gate_up_proj, experts.down_proj  # local tensors (inside the EP forward)
            if not getattr(experts, "is_transposed", False):  # [E, 2F, H], [E, H, F]: applied as F.linear
                w_gu, w_down = w_gu.transpose(1, 2), w_down.transpose(1, 2)
            if self.expert_form == "bmm":
                return torch.bmm(experts._apply_gate(torch.bmm(xe, w_gu)), w_down)
            return torch.stack([experts._apply_gate(xe[i] @ w_gu[i]) @ w_down[i] for i in range(xe.shape[0])])

    return OverlapAllToAllEP


_CLASS = None


def ep_implementation_class():
    """The :class:`OverlapAllToAllEP` class (built on transformers' ``EPImplementation`` at first use)."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _make_class()
    return _CLASS


def register_ep_implementation(name: str = EP_IMPLEMENTATION, *, capacity_factor: float | None = None,
                               expert_form: str = "bmm") -> str:
    """Register the static-shape all-to-all expert parallelism with transformers under ``name`` (returned), for
    ``DistributedConfig(ep_implementation=name)``. ``capacity_factor`` / ``expert_form``: see
    :class:`OverlapAllToAllEP`; another combination needs another ``name``."""
    from transformers.distributed.expert_parallel import EPImplementationInterface

    if expert_form not in EXPERT_FORMS:
        raise ValueError(f"expert_form={expert_form!r}; allowed: {', '.join(EXPERT_FORMS)}")
    base = ep_implementation_class()
    cls = base
    if capacity_factor is not None or expert_form != base.expert_form:
        cls = type(base.__name__, (base,), {"capacity_factor": capacity_factor, "expert_form": expert_form})
    EPImplementationInterface.register(name, cls)
    return name


__all__ = ["EP_IMPLEMENTATION", "EXPERT_FORMS", "register_ep_implementation", "ep_implementation_class",
           "unsupported_experts"]
