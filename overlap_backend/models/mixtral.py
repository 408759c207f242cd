"""A Mixtral-style MoE decoder with expert parallelism.

The Llama decoder of :mod:`overlap_backend.models.llama` with every feed-forward replaced by
:class:`overlap_backend.models.moe.MoELayer` (router, top-k, ``all_to_all_single`` dispatch, SwiGLU
experts, combine): Mixtral 8x7B's structure (8 experts, top-2, grouped-query attention).

Parallelism, the usual one for MoE training without TP ("expert parallelism borrows the data
parallel ranks", as in DeepSpeed-MoE, Megatron's EP over the DP group and torchtitan's
``dp_shard x ep``):

- **experts**: expert-parallel over ``group``: rank ``r`` holds experts ``r * E/ws ... (r+1) * E/ws - 1``;
  every rank routes its own tokens, the dispatch/combine all-to-alls move them to their experts
  and back (this is what the ``moe`` pass rewrites);
- **everything else** (embedding, attention, norms, router, head): data-parallel: replicated on
  every rank, each rank computes on its own batch; after backward their gradients are summed over
  the group (:func:`sync_dense_grads`, what DDP would do), the expert gradients are already
  complete (the all-to-all backward brings every rank's contribution to the expert's owner).

The token policy is ``capacity`` by default (static shapes: one graph, no unbacked sizes), the
expert GEMMs ``grouped_mm`` (bfloat16, as torchtitan) or ``bmm``/``loop`` (exact in float32: the
CPU tests use ``bmm``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from .llama import LlamaConfig, Transformer
from .moe import MoELayer


@dataclass
class MixtralConfig(LlamaConfig):
    ffn_dim: int = 14336  # per expert
    num_experts: int = 8
    top_k: int = 2
    policy: str = "capacity"
    expert_form: str = "grouped_mm"
    capacity_factor: float = 1.25


EXPERT_PARAMS = ("w_gate", "w_up", "w_down")


def build_mixtral(cfg: MixtralConfig, group: dist.ProcessGroup | None = None, *, seed: int = 0, device=None,
                  dtype=torch.float32) -> Transformer:
    """The decoder; layer ``i``'s MoE layer draws its (full) expert weights from ``seed + 1 + i``
    and keeps this rank's experts; all other weights come from ``seed`` (identical on every rank)."""

    def make_ffn(i: int) -> nn.Module:
        return MoELayer(cfg.dim, cfg.ffn_dim, cfg.num_experts, cfg.top_k, group=group, policy=cfg.policy,
                        expert_form=cfg.expert_form, capacity_factor=cfg.capacity_factor, dtype=dtype,
                        device=device, seed=seed + 1 + i)

    return Transformer(cfg, device=device, dtype=dtype, seed=seed, make_ffn=make_ffn)


def expert_parameters(model: nn.Module) -> list[nn.Parameter]:
    """This rank's expert weights (not replicated: no gradient all-reduce)."""
    return [getattr(m, n) for m in model.modules() if isinstance(m, MoELayer) for n in EXPERT_PARAMS]


def dense_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The replicated (data-parallel) parameters: everything but the experts."""
    experts = {id(p) for p in expert_parameters(model)}
    return [p for p in model.parameters() if id(p) not in experts]


@torch.no_grad()
def sync_dense_grads(model: nn.Module, group: dist.ProcessGroup | None = None) -> None:
    """Sum the replicated parameters' gradients over ``group`` (one flat all-reduce). With each
    rank's loss divided by the group size, that makes them the gradient of the mean loss."""
    grads = [p.grad for p in dense_parameters(model) if p.grad is not None]
    if not grads or dist.get_world_size(group) == 1:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


__all__ = ["MixtralConfig", "build_mixtral", "expert_parameters", "dense_parameters", "sync_dense_grads"]
