"""Reference tensor-parallel models, written the way users write them.

They are what the demo, the tests and the benchmarks compile: the collectives appear exactly as a
user's code produces them (functional collectives, in-place c10d, or DTensor's
``parallelize_module``), so the passes see the graphs they will see in the wild.

- :class:`TPBlock`: a transformer block with Megatron-style sequence parallelism written with
  functional collectives (all-gather along the sequence → column-parallel GEMMs, row-parallel GEMM
  → reduce-scatter along the sequence).
- :class:`TPMlpAllReduce`: an inference-style tensor-parallel MLP ending in an all-reduce.
- :func:`build_dtensor_block`: norm + MLP parallelised with ``parallelize_module``.

Every rank builds the FULL weights from one generator seeded with ``seed`` and keeps its own shard,
so the models are identical on every rank and from run to run, whatever the world size.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import nn

# torch 2.13 names them *_single (and gives them autograd); older releases only have the *_tensor
# names, whose plain variants do not propagate gradients: take the *_autograd ones there.
all_gather = (
    getattr(funcol, "all_gather_single", None)
    or getattr(funcol, "all_gather_tensor_autograd", None)
    or funcol.all_gather_tensor
)
reduce_scatter = (
    getattr(funcol, "reduce_scatter_single", None)
    or getattr(funcol, "reduce_scatter_tensor_autograd", None)
    or funcol.reduce_scatter_tensor
)


class FullInit:
    """Draws full-size tensors from one seeded generator; each rank slices out its shard."""

    def __init__(self, seed: int, dtype: torch.dtype, device: torch.device | str | None):
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.dtype = dtype
        # A generator on the target device: the same seed gives the same numbers on every rank
        # (and no host-side generation of GPU-sized weights).
        self.gen = torch.Generator(device=self.device).manual_seed(seed)

    def normal(self, *shape: int, std: float = 1.0, mean: float = 0.0) -> torch.Tensor:
        t = torch.randn(shape, generator=self.gen, device=self.device, dtype=torch.float32)
        return (t * std + mean).to(self.dtype)

    def linear(self, fan_in: int, *shape: int) -> torch.Tensor:
        return self.normal(*shape, std=1.0 / math.sqrt(fan_in))


def _shard(t: torch.Tensor, dim: int, rank: int, world_size: int) -> nn.Parameter:
    size = t.shape[dim]
    if size % world_size:
        raise ValueError(f"dim {dim} of shape {tuple(t.shape)} is not divisible by the world size {world_size}")
    return nn.Parameter(t.narrow(dim, rank * (size // world_size), size // world_size).contiguous())


def group_info(group: dist.ProcessGroup | None) -> tuple[dist.ProcessGroup, int, int]:
    group = group if group is not None else dist.group.WORLD
    return group, dist.get_rank(group), dist.get_world_size(group)


def _layer_norm(hidden: int, init: FullInit) -> nn.LayerNorm:
    # Random affine parameters (not ones/zeros) so that their gradients are checked meaningfully.
    ln = nn.LayerNorm(hidden, device=init.device, dtype=init.dtype)
    with torch.no_grad():
        ln.weight.copy_(init.normal(hidden, std=0.1, mean=1.0))
        ln.bias.copy_(init.normal(hidden, std=0.1))
    return ln


class TPBlock(nn.Module):
    """Transformer block, tensor parallel with sequence parallelism (Megatron-LM style).

    Input and output ``[batch, seq / ws, hidden]``: sharded along the sequence (dim 1) over
    ``group``. Per rank::

        h   = x + RS(attn(AG(ln1(x))) @ wo)            # AG/RS: all-gather / reduce-scatter, dim 1
        out = h + RS(F.linear(gelu(F.linear(AG(ln2(h)), fc1_w, fc1_b)), fc2_w))

    One all-gather feeds the three column-parallel projections Q, K, V (``[hidden, heads/ws *
    head_dim]`` each, used as ``x @ w``; Q and V with bias); ``wo`` is row-parallel, no bias.
    ``fc1`` (column-parallel, bias) and ``fc2`` (row-parallel, no bias) are ``nn.Linear``-layout
    weights (``[out, in]``) used through ``F.linear``. Attention is causal over this rank's heads.
    """

    def __init__(
        self,
        hidden: int,
        heads: int,
        ffn: int,
        group: dist.ProcessGroup | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        seed: int = 0,
    ):
        super().__init__()
        self.group, rank, ws = group_info(group)
        if hidden % heads:
            raise ValueError(f"hidden {hidden} is not divisible by heads {heads}")
        if heads % ws or ffn % ws:
            raise ValueError(f"heads {heads} and ffn {ffn} must be divisible by the world size {ws}")
        self.heads_local = heads // ws
        self.head_dim = hidden // heads
        init = FullInit(seed, dtype, device)
        inner = heads * self.head_dim

        # Full weights drawn in a fixed order on every rank; each keeps its shard.
        self.ln1 = _layer_norm(hidden, init)
        self.wq = _shard(init.linear(hidden, hidden, inner), 1, rank, ws)
        self.bq = _shard(init.normal(inner, std=0.02), 0, rank, ws)
        self.wk = _shard(init.linear(hidden, hidden, inner), 1, rank, ws)
        self.wv = _shard(init.linear(hidden, hidden, inner), 1, rank, ws)
        self.bv = _shard(init.normal(inner, std=0.02), 0, rank, ws)
        self.wo = _shard(init.linear(inner, inner, hidden), 0, rank, ws)
        self.ln2 = _layer_norm(hidden, init)
        self.fc1_w = _shard(init.linear(hidden, ffn, hidden), 0, rank, ws)
        self.fc1_b = _shard(init.normal(ffn, std=0.02), 0, rank, ws)
        self.fc2_w = _shard(init.linear(ffn, hidden, ffn), 1, rank, ws)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        g = all_gather(self.ln1(x), 1, self.group)  # [b, s, hidden]
        b, s, _ = g.shape
        q = g @ self.wq + self.bq
        k = g @ self.wk
        v = g @ self.wv + self.bv

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, self.heads_local, self.head_dim).transpose(1, 2)

        o = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        o = o.transpose(1, 2).reshape(b, s, self.heads_local * self.head_dim)
        return reduce_scatter(o @ self.wo, "sum", 1, self.group)  # [b, s / ws, hidden]

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        g = all_gather(self.ln2(h), 1, self.group)
        y = F.gelu(F.linear(g, self.fc1_w, self.fc1_b))
        return reduce_scatter(F.linear(y, self.fc2_w), "sum", 1, self.group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(x)
        return h + self.mlp(h)


class TPSwiGLUMlp(nn.Module):
    """Sequence-parallel SwiGLU MLP with RMSNorm and a residual (Llama-style), functional collectives.

    Input and output ``[batch, seq / ws, hidden]``. Per rank::

        g   = AG(rmsnorm(x))                                  # all-gather along the sequence
        out = x + RS((silu(g @ w_gate) * (g @ w_up)) @ w_down)

    ``w_gate``/``w_up`` ``[hidden, ffn / ws]`` (column-parallel), ``w_down`` ``[ffn / ws, hidden]``
    (row-parallel), ``norm_w`` ``[hidden]``. The gate and up projections share one all-gather.
    """

    def __init__(
        self,
        hidden: int,
        ffn: int,
        group: dist.ProcessGroup | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        seed: int = 0,
        eps: float = 1e-6,
    ):
        super().__init__()
        self.group, rank, ws = group_info(group)
        init = FullInit(seed, dtype, device)
        self.eps = eps
        self.norm_w = nn.Parameter(init.normal(hidden, std=0.1, mean=1.0))
        self.w_gate = _shard(init.linear(hidden, hidden, ffn), 1, rank, ws)
        self.w_up = _shard(init.linear(hidden, hidden, ffn), 1, rank, ws)
        self.w_down = _shard(init.linear(ffn, ffn, hidden), 0, rank, ws)

    def rmsnorm(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.norm_w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = all_gather(self.rmsnorm(x), 1, self.group)
        h = F.silu(g @ self.w_gate) * (g @ self.w_up)
        return x + reduce_scatter(h @ self.w_down, "sum", 1, self.group)


class TPMlpAllReduce(nn.Module):
    """Inference-style tensor-parallel MLP: ``all_reduce(gelu(x @ w1 + b1) @ w2)``.

    ``x``: ``[tokens, hidden]``, replicated. ``w1`` ``[hidden, ffn / ws]`` column-parallel with bias,
    ``w2`` ``[ffn / ws, hidden]`` row-parallel, then a sum all-reduce: ``funcol.all_reduce``, or with
    ``inplace_c10d=True`` the in-place ``torch.distributed.all_reduce`` (Dynamo traces it to the same
    functional op).
    """

    def __init__(
        self,
        hidden: int,
        ffn: int,
        group: dist.ProcessGroup | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        seed: int = 0,
        inplace_c10d: bool = False,
    ):
        super().__init__()
        self.group, rank, ws = group_info(group)
        self.inplace_c10d = inplace_c10d
        init = FullInit(seed, dtype, device)
        self.w1 = _shard(init.linear(hidden, hidden, ffn), 1, rank, ws)
        self.b1 = _shard(init.normal(ffn, std=0.02), 0, rank, ws)
        self.w2 = _shard(init.linear(ffn, ffn, hidden), 0, rank, ws)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.gelu(x @ self.w1 + self.b1) @ self.w2
        if self.inplace_c10d:
            dist.all_reduce(y, group=self.group)
            return y
        return funcol.all_reduce(y, "sum", self.group)


class _NormMlp(nn.Module):
    """``x + w2(gelu(w1(norm(x))))``: attention-free block for :func:`build_dtensor_block`."""

    def __init__(self, hidden: int, ffn: int, init: FullInit):
        super().__init__()
        self.norm = _layer_norm(hidden, init)
        self.w1 = nn.Linear(hidden, ffn, device=init.device, dtype=init.dtype)
        self.w2 = nn.Linear(ffn, hidden, bias=False, device=init.device, dtype=init.dtype)
        with torch.no_grad():
            self.w1.weight.copy_(init.linear(hidden, ffn, hidden))
            self.w1.bias.copy_(init.normal(ffn, std=0.02))
            self.w2.weight.copy_(init.linear(ffn, hidden, ffn))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(F.gelu(self.w1(self.norm(x))))


def build_dtensor_block(
    hidden: int,
    ffn: int,
    mesh,
    sequence_parallel: bool,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> nn.Module:
    """Norm + MLP (``w1``, ``w2`` ``nn.Linear``) parallelised with ``parallelize_module``.

    ``w1`` is ``ColwiseParallel``, ``w2`` ``RowwiseParallel``. Without sequence parallelism the
    input is replicated ``[batch, seq, hidden]`` and ``w2`` ends in an all-reduce. With it, as in the
    PyTorch TP tutorial, the input is the local ``Shard(1)`` (sequence) shard ``[batch, seq / ws,
    hidden]``: ``SequenceParallel`` on the norm, ``w1`` takes ``Shard(1)`` input (all-gather) and
    ``w2`` produces ``Shard(1)`` output (reduce-scatter). Weights are drawn from ``seed`` on every
    rank before parallelising, so every rank shards the same full weights.
    """
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    module = _NormMlp(hidden, ffn, FullInit(seed, dtype, mesh.device_type))
    if sequence_parallel:
        plan = {
            "norm": SequenceParallel(),
            "w1": ColwiseParallel(input_layouts=Shard(1)),
            "w2": RowwiseParallel(output_layouts=Shard(1)),
        }
    else:
        plan = {"w1": ColwiseParallel(), "w2": RowwiseParallel()}
    return parallelize_module(module, mesh, plan)


__all__ = ["TPBlock", "TPSwiGLUMlp", "TPMlpAllReduce", "build_dtensor_block"]
