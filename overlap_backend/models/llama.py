"""A Llama-style decoder as users write it, and its tensor + sequence parallel plan (DTensor).

The model is plain PyTorch (Meta's / torchtitan's Llama structure)::

    tokens -> tok_embeddings -> n_layers x TransformerBlock -> norm -> output (lm head) -> logits
    TransformerBlock:  h   = x + attention(attention_norm(x))
                       out = h + feed_forward(ffn_norm(h))
    attention:         wq, wk, wv (nn.Linear, no bias) -> RoPE -> F.scaled_dot_product_attention(is_causal=True)
                       -> wo ; grouped-query attention when n_kv_heads < n_heads
    feed_forward:      w2(silu(w1(x)) * w3(x))                       (SwiGLU)
    RMSNorm:           x * rsqrt(mean(x^2) + eps) * weight           (computed in float32)

:func:`parallelize_llama` applies torchtitan's plan with ``parallelize_module``:
``SequenceParallel`` on the norms, ``PrepareModuleInput`` (``Shard(1)`` -> ``Replicate``: one
all-gather along the sequence) in front of attention and feed-forward, ``ColwiseParallel`` on
wq/wk/wv/w1/w3, ``RowwiseParallel(output_layouts=Shard(1))`` (matmul -> reduce-scatter) on wo/w2;
the embedding is vocab-parallel with a ``Shard(1)`` output, the head column-parallel with a
``Shard(1)`` input and replicated logits (no loss parallelism: every rank computes the full
cross-entropy). Heads are divided over the TP ranks: each rank holds ``n_heads / tp`` query heads
and ``n_kv_heads / tp`` key/value heads (the attention infers them from its local projections).
``sequence_parallel=False`` gives the plain TP plan (replicated activations, all-reduce after
wo/w2): what the serving loop uses (a decode step has one token per sequence, nothing to shard).

Serving: :meth:`Transformer.setup_cache` gives every attention a static KV cache
``[batch, n_kv_heads_local, max_seq, head_dim]``; ``model(tokens, input_pos)`` then writes the new
keys/values at ``input_pos`` (a tensor, ``index_copy_``) and attends to the whole cache under the
causal mask row of each position. Shapes are fixed (prefill ``[b, P]``, decode ``[b, 1]``;
``input_pos`` a tensor, not a Python int), so ``torch.compile`` builds one graph for the prefill and
one for every decode step (gpt-fast's scheme), without ``mark_dynamic``.

Weights: every rank draws the FULL weights from one generator seeded with ``seed`` (normal,
std 0.02; output projections scaled by ``1/sqrt(2 n_layers)``; norms 1 + small noise so their
gradients are checked meaningfully) before parallelising, so the model is identical on every rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LlamaConfig:
    vocab_size: int = 32000
    dim: int = 4096
    n_layers: int = 8
    n_heads: int = 32
    n_kv_heads: int | None = 8  # None: n_heads (multi-head attention)
    ffn_dim: int = 14336
    seq_len: int = 2048  # longest sequence: RoPE table and causal mask of the KV cache
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5

    def __post_init__(self):
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even (RoPE)")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def check_tp(self, tp: int) -> None:
        """Raise unless heads, kv heads, ffn and vocab divide over ``tp`` ranks."""
        for name in ("n_heads", "n_kv_heads", "ffn_dim", "vocab_size"):
            if getattr(self, name) % tp:
                raise ValueError(f"{name} {getattr(self, name)} is not divisible by the TP size {tp}")


# ------------------------------------------------------------------------------------ layers
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_tables(head_dim: int, seq_len: int, theta: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos``, ``sin`` ``[seq_len, head_dim]`` (float32) of the rotary embedding (half-split layout)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [b, s, heads, head_dim]``, ``cos``/``sin`` ``[s, head_dim]``."""
    cos, sin = cos[:, None, :], sin[:, None, :]
    xf = x.float()
    return (xf * cos + _rotate_half(xf) * sin).type_as(x)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """``[b, s, kv_heads, d]`` -> ``[b, s, kv_heads * n_rep, d]`` (grouped-query attention)."""
    if n_rep == 1:
        return x
    b, s, h, d = x.shape
    return x[:, :, :, None, :].expand(b, s, h, n_rep, d).reshape(b, s, h * n_rep, d)


class KVCache(nn.Module):
    """Static key/value cache ``[batch, kv_heads, max_seq, head_dim]`` of one attention layer."""

    def __init__(self, batch: int, kv_heads: int, max_seq: int, head_dim: int, dtype, device):
        super().__init__()
        shape = (batch, kv_heads, max_seq, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Write ``k``/``v`` ``[b, kv_heads, s, d]`` at positions ``input_pos [s]``; the whole cache."""
        self.k.index_copy_(2, input_pos, k)
        self.v.index_copy_(2, input_pos, v)
        return self.k, self.v


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig, device=None, dtype=None):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.n_rep = cfg.n_heads // cfg.n_kv_heads
        kv = cfg.n_kv_heads * cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.dim, bias=False, device=device, dtype=dtype)
        self.wk = nn.Linear(cfg.dim, kv, bias=False, device=device, dtype=dtype)
        self.wv = nn.Linear(cfg.dim, kv, bias=False, device=device, dtype=dtype)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False, device=device, dtype=dtype)
        self.cache: KVCache | None = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                input_pos: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, s, _ = x.shape
        # -1: the heads this rank holds (n_heads / tp under tensor parallelism)
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q = q.transpose(1, 2)
        if self.cache is None:  # training: causal attention over the sequence
            k, v = repeat_kv(k, self.n_rep).transpose(1, 2), repeat_kv(v, self.n_rep).transpose(1, 2)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # serving: the static cache, masked to the positions written so far
            k, v = self.cache.update(input_pos, k.transpose(1, 2), v.transpose(1, 2))
            k = repeat_kv(k.transpose(1, 2), self.n_rep).transpose(1, 2)
            v = repeat_kv(v.transpose(1, 2), self.n_rep).transpose(1, 2)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, ffn_dim: int, device=None, dtype=None):
        super().__init__()
        self.w1 = nn.Linear(dim, ffn_dim, bias=False, device=device, dtype=dtype)
        self.w2 = nn.Linear(ffn_dim, dim, bias=False, device=device, dtype=dtype)
        self.w3 = nn.Linear(dim, ffn_dim, bias=False, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """``h = x + attention(attention_norm(x)); out = h + feed_forward(ffn_norm(h))``.

    ``feed_forward`` is any module ``[..., dim] -> [..., dim]`` (the dense SwiGLU here; the MoE
    layer in :mod:`overlap_backend.models.mixtral`)."""

    def __init__(self, cfg: LlamaConfig, feed_forward: nn.Module | None = None, device=None, dtype=None):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps, device=device, dtype=dtype)
        self.attention = Attention(cfg, device=device, dtype=dtype)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps, device=device, dtype=dtype)
        self.feed_forward = feed_forward if feed_forward is not None else FeedForward(
            cfg.dim, cfg.ffn_dim, device=device, dtype=dtype)

    def forward(self, x, cos, sin, input_pos=None, mask=None):
        h = x + self.attention(self.attention_norm(x), cos, sin, input_pos, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """The decoder. ``forward(tokens [b, s])`` -> logits ``[b, s, vocab]`` (training, causal);
    after :meth:`setup_cache`, ``forward(tokens, input_pos)`` -> logits of the LAST position
    ``[b, 1, vocab]`` (serving; ``input_pos [s]`` the positions of ``tokens``)."""

    def __init__(self, cfg: LlamaConfig, device=None, dtype=None, seed: int | None = 0, make_ffn=None):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim, device=device, dtype=dtype)
        self.layers = nn.ModuleList(
            TransformerBlock(cfg, make_ffn(i) if make_ffn is not None else None, device=device, dtype=dtype)
            for i in range(cfg.n_layers)
        )
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps, device=device, dtype=dtype)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False, device=device, dtype=dtype)
        cos, sin = rope_tables(cfg.head_dim, cfg.seq_len, cfg.rope_theta, device=device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.causal_mask: torch.Tensor | None = None
        if seed is not None:
            init_weights(self, seed)

    def setup_cache(self, batch: int, max_seq: int | None = None) -> None:
        """Static KV caches for serving (after parallelising: each holds this rank's kv heads)."""
        max_seq = max_seq or self.cfg.seq_len
        if max_seq > self.cfg.seq_len:
            raise ValueError(f"max_seq {max_seq} > seq_len {self.cfg.seq_len} (the RoPE table)")
        for layer in self.layers:
            attn = layer.attention
            w = attn.wk.weight
            w = w.to_local() if hasattr(w, "to_local") else w
            kv_heads = w.shape[0] // attn.head_dim
            attn.cache = KVCache(batch, kv_heads, max_seq, attn.head_dim, dtype=w.dtype, device=w.device)
        self.causal_mask = torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool, device=self.rope_cos.device))

    def reset_cache(self) -> None:
        for layer in self.layers:
            if layer.attention.cache is not None:
                layer.attention.cache.k.zero_()
                layer.attention.cache.v.zero_()

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor | None = None) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        if input_pos is None:
            s = tokens.shape[1]
            cos, sin, mask = self.rope_cos[:s], self.rope_sin[:s], None
        else:
            cos, sin = self.rope_cos[input_pos], self.rope_sin[input_pos]
            mask = self.causal_mask[input_pos][None, None]  # [1, 1, s, max_seq]
        for layer in self.layers:
            h = layer(h, cos, sin, input_pos, mask)
        if input_pos is not None:
            h = h[:, -1:]
        return self.output(self.norm(h))


@torch.no_grad()
def init_weights(model: nn.Module, seed: int) -> None:
    """Deterministic init from one generator (the same on every rank): the weights of every
    ``nn.Linear`` and ``nn.Embedding`` normal(0, 0.02), ``wo``/``w2`` scaled by 1/sqrt(2 n_layers)
    (GPT-2), :class:`RMSNorm` weights 1 + normal(0, 0.1). Other modules' parameters (an MoE layer,
    which draws its own from its seed) are left alone."""
    params = [(name, p) for mod_name, mod in model.named_modules() if isinstance(mod, (nn.Linear, nn.Embedding, RMSNorm))
              for name, p in ((f"{mod_name}.{n}", p) for n, p in mod.named_parameters(recurse=False))]
    if not params:
        return
    device = params[0][1].device
    gen = torch.Generator(device=device).manual_seed(seed)
    n_layers = getattr(getattr(model, "cfg", None), "n_layers", 1)
    for name, p in params:
        t = torch.randn(p.shape, generator=gen, device=device, dtype=torch.float32)
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * t
        else:
            t = t * 0.02
            if name.endswith(("wo.weight", "w2.weight")):
                t = t / math.sqrt(2 * n_layers)
        p.copy_(t.to(p.dtype))


def compile_llama(model: Transformer, backend, per_block: bool = True, **compile_kwargs) -> nn.Module:
    """``torch.compile`` the model for ``backend``.

    ``per_block`` (torchtitan's way): each :class:`TransformerBlock` is compiled on its own (one
    graph, reused by every layer, so compile time does not grow with depth) and so is the token
    embedding; the final norm, the head and the loss run eagerly. The embedding is compiled because
    under TP its output is an ``AsyncCollectiveTensor`` (``RowwiseParallel``'s async redistribute),
    and on torch 2.13 such a tensor handed from eager code into a compiled block breaks the
    backward (DTensor's ``Redistribute.backward`` receives a plain tensor:
    ``'Tensor' object has no attribute '_local_tensor'``); a compiled embedding returns a plain
    tensor, and the first block then sees the same input type as the others (an eager embedding's
    ``AsyncCollectiveTensor`` would also give layer 0 a graph of its own). ``per_block=False``
    compiles the whole model as one graph.

    Per block, the compiled modules (``torch.compile``'s wrappers) replace the originals in
    ``model`` (parameter names gain ``_orig_mod.``) and ``model`` is returned; ``nn.Module.compile``
    (in place, names unchanged) is not used because on torch 2.13 it fails on the vocab-parallel
    embedding ("Mixing fake modes NYI" while tracing ``F.embedding`` of its DTensor weight), where
    the wrapper works. Whole model: the wrapper is returned."""
    if not per_block:
        return torch.compile(model, backend=backend, **compile_kwargs)
    model.tok_embeddings = torch.compile(model.tok_embeddings, backend=backend, **compile_kwargs)
    for i, block in enumerate(model.layers):
        model.layers[i] = torch.compile(block, backend=backend, **compile_kwargs)
    return model


# ------------------------------------------------------------------------- tensor parallelism
def parallelize_llama(model: Transformer, tp_mesh, sequence_parallel: bool = True) -> Transformer:
    """Tensor (+ sequence) parallelism with ``parallelize_module``, as torchtitan does it.

    With ``sequence_parallel`` the activations between blocks are ``Shard(1)`` (each rank holds
    ``seq / tp`` positions, as local tensors); every block all-gathers them once before attention
    and once before the feed-forward, and reduce-scatters after wo and w2. Without it, activations
    are replicated and wo/w2 end in an all-reduce. Modifies ``model`` in place and returns it.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    model.cfg.check_tp(tp_mesh.size())
    sp = sequence_parallel
    parallelize_module(model, tp_mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1) if sp else Replicate()),
        **({"norm": SequenceParallel()} if sp else {}),
        "output": ColwiseParallel(input_layouts=Shard(1) if sp else Replicate(), output_layouts=Replicate()),
    })
    for block in model.layers:
        plan = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1) if sp else Replicate()),
        }
        if isinstance(block.feed_forward, FeedForward):
            plan.update({
                "feed_forward.w1": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1) if sp else Replicate()),
                "feed_forward.w3": ColwiseParallel(),
            })
        if sp:
            plan.update({
                "attention_norm": SequenceParallel(),
                "attention": PrepareModuleInput(input_layouts=(Shard(1), None, None, None, None),
                                                desired_input_layouts=(Replicate(), None, None, None, None)),
                "ffn_norm": SequenceParallel(),
                "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            })
        parallelize_module(block, tp_mesh, plan)
    return model


def build_llama(cfg: LlamaConfig, tp_mesh=None, *, sequence_parallel: bool = True, seed: int = 0,
                device=None, dtype=torch.float32) -> Transformer:
    """The model with weights drawn from ``seed``, parallelised over ``tp_mesh`` when given."""
    model = Transformer(cfg, device=device, dtype=dtype, seed=seed)
    if tp_mesh is not None:
        parallelize_llama(model, tp_mesh, sequence_parallel=sequence_parallel)
    return model


__all__ = ["LlamaConfig", "RMSNorm", "Attention", "FeedForward", "TransformerBlock", "Transformer", "KVCache",
           "init_weights", "compile_llama", "parallelize_llama", "build_llama", "rope_tables", "apply_rope",
           "repeat_kv"]
