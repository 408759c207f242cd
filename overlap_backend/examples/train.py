"""Training on synthetic tokens: the loop that compares the overlap backend with eager.

    losses = train(model, steps=300, batch=8, seq_len=2048, vocab=cfg.vocab_size)

Data (:func:`synthetic_batch`): a fixed random affine "grammar" over the vocabulary,
``t[i+1] = (a * t[i] + c) mod vocab``, each sequence from a random start, with a small share of
tokens replaced by random ones. A model learns the map step by step, so the loss curve falls
steadily (random tokens would leave it flat at ``log(vocab)`` and compare nothing). Batches are a
function of ``(seed, step)`` only: every rank draws the same global batch; with data parallelism
(``rows``) each rank keeps its slice.

Step (:func:`train_step`): forward, cross-entropy over every position (in float32), backward,
an optional gradient hook (the data-parallel all-reduce of :func:`overlap_backend.models.mixtral.sync_dense_grads`),
AdamW. The model is whatever the caller built and compiled (eager, Inductor, ``backend="overlap"``;
:func:`overlap_backend.models.llama.compile_llama`); the same seeds give the same initial weights, so the
loss curves of two runs are comparable step by step.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def _affine_tables(vocab: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``A[i] = a^i``, ``B[i] = c (a^(i-1) + ... + 1)`` mod vocab: ``t[i] = A[i] t[0] + B[i]``."""
    g = torch.Generator().manual_seed(seed)
    a = int(torch.randint(2, max(3, vocab), (1,), generator=g))
    while math.gcd(a, vocab) != 1:  # a permutation of the vocabulary
        a += 1
    c = int(torch.randint(1, max(2, vocab), (1,), generator=g))
    A, B = [1], [0]
    for _ in range(length - 1):
        A.append(A[-1] * a % vocab)
        B.append((B[-1] * a + c) % vocab)
    return torch.tensor(A, dtype=torch.int64), torch.tensor(B, dtype=torch.int64)


def synthetic_batch(vocab: int, batch: int, seq_len: int, step: int, *, seed: int = 0, noise: float = 0.05,
                    device=None, rows: slice | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, targets)``, ``[batch, seq_len]`` int64 each (targets = inputs shifted by one), of
    step ``step``; the same on every rank. ``rows``: keep those rows of the global batch."""
    A, B = _affine_tables(vocab, seq_len + 1, seed)
    g = torch.Generator().manual_seed(seed * 1_000_003 + step + 1)
    start = torch.randint(vocab, (batch, 1), generator=g)
    tokens = (A[None] * start + B[None]) % vocab
    flip = torch.rand(batch, seq_len + 1, generator=g) < noise
    tokens = torch.where(flip, torch.randint(vocab, (batch, seq_len + 1), generator=g), tokens)
    if rows is not None:
        tokens = tokens[rows]
    tokens = tokens.to(device) if device is not None else tokens
    return tokens[:, :-1], tokens[:, 1:]


def rank_rows(batch: int, group: dist.ProcessGroup | None = None) -> slice:
    """This rank's rows of a global batch of ``batch * ws`` (data parallelism)."""
    r = dist.get_rank(group)
    return slice(r * batch, (r + 1) * batch)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    if hasattr(logits, "full_tensor"):  # a DTensor (replicated logits kept as DTensor)
        logits = logits.full_tensor()
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def make_optimizer(model: nn.Module, lr: float = 1e-3, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """AdamW (torch's default implementation). DTensor parameters work as they are, the
    sequence-parallel norms included, whose gradients are ``Partial`` (AdamW's ops reduce them)."""
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor, *,
               loss_scale: float = 1.0, grad_hook: Callable[[], None] | None = None) -> torch.Tensor:
    """One step; returns the (unscaled, detached) loss without reading it on the host."""
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(inputs), targets)
    (loss * loss_scale if loss_scale != 1.0 else loss).backward()
    if grad_hook is not None:
        grad_hook()
    opt.step()
    return loss.detach()


def train(model: nn.Module, steps: int, *, batch: int, seq_len: int, vocab: int, lr: float = 1e-3,
          seed: int = 0, device=None, group: dist.ProcessGroup | None = None, data_parallel: bool = False,
          grad_hook: Callable[[], None] | None = None, opt: torch.optim.Optimizer | None = None) -> list[float]:
    """``steps`` AdamW steps on synthetic batches; the loss of every step (a Python float).

    Tensor parallelism (``data_parallel=False``): every rank takes the same ``batch`` rows and the
    loss is the same on every rank. Data/expert parallelism (``data_parallel=True``): the global
    batch is ``batch * ws`` rows, each rank takes its own ``batch``, its loss is scaled by ``1/ws``
    for backward (``grad_hook`` sums the replicated parameters' gradients), and the loss reported is
    the mean over ranks.
    """
    opt = opt or make_optimizer(model, lr)
    ws = dist.get_world_size(group) if dist.is_initialized() else 1
    losses = []
    for step in range(steps):
        if data_parallel:
            inputs, targets = synthetic_batch(vocab, batch * ws, seq_len, step, seed=seed, device=device,
                                              rows=rank_rows(batch, group))
        else:
            inputs, targets = synthetic_batch(vocab, batch, seq_len, step, seed=seed, device=device)
        loss = train_step(model, opt, inputs, targets, loss_scale=1.0 / ws if data_parallel else 1.0,
                          grad_hook=grad_hook)
        if data_parallel and ws > 1:
            loss = loss.clone()
            dist.all_reduce(loss, group=group)
            loss = loss / ws
        losses.append(float(loss))
    return losses


def compare_curves(got: list[float], ref: list[float]) -> dict:
    """Step-by-step comparison of two loss curves: max and mean relative difference, the step of
    the max, first and last losses of each."""
    if len(got) != len(ref) or not ref:
        return {"steps": len(ref), "max_rel_diff": float("inf"), "mean_rel_diff": float("inf"), "argmax": None}
    rel = [abs(g - r) / max(abs(r), 1e-12) for g, r in zip(got, ref)]
    rel = [float("inf") if r != r else r for r in rel]  # NaN never passes
    i = max(range(len(rel)), key=rel.__getitem__)
    return {"steps": len(ref), "max_rel_diff": rel[i], "mean_rel_diff": sum(rel) / len(rel), "argmax": i,
            "first": [got[0], ref[0]], "last": [got[-1], ref[-1]]}


__all__ = ["synthetic_batch", "rank_rows", "loss_fn", "make_optimizer", "train_step", "train", "compare_curves"]
