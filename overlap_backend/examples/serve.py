"""Serving loop on the Llama decoder: prefill a prompt batch, then greedy decoding with a KV cache.

    model.setup_cache(batch, max_seq)                 # static caches (after parallelize_llama)
    compile_llama(model, backend)                     # optional
    out = generate(model, prompts, new_tokens=32)     # out.tokens [batch, 32], out.prefill_s, out.decode_s

Shapes are fixed, so a compiled model builds two graphs and never recompiles: the prefill
``tokens [b, P]``, ``input_pos = arange(P)``; every decode step ``tokens [b, 1]`` with
``input_pos`` a one-element tensor (a tensor, not a Python int: Dynamo would specialise on an int
and recompile, or turn it dynamic after the second value). The cache is written with
``index_copy_`` at ``input_pos`` and attention reads the whole static cache under the causal mask
row of each position (gpt-fast's scheme); no ``mark_dynamic``.

Under tensor parallelism every rank feeds the same prompts and computes the same tokens (the
logits are replicated); the plan for serving is the one without sequence parallelism
(``parallelize_llama(model, mesh, sequence_parallel=False)``: all-reduce after wo and w2, the
``mm_ar`` pass), since a decode step has one position per sequence.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Generation:
    tokens: torch.Tensor  # [batch, new_tokens] greedy tokens after the prompt
    prefill_s: float  # prefill wall time (the first new token included)
    decode_s: float  # the other new_tokens - 1 steps
    batch: int
    prompt_len: int
    new_tokens: int

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.batch * self.prompt_len / self.prefill_s if self.prefill_s > 0 else float("nan")

    @property
    def decode_tokens_per_s(self) -> float:
        n = self.batch * (self.new_tokens - 1)
        return n / self.decode_s if self.decode_s > 0 else float("nan")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def generate(model: nn.Module, prompts: torch.Tensor, new_tokens: int) -> Generation:
    """Greedy decoding of ``new_tokens`` tokens after ``prompts [b, P]`` (caches reset first).

    Times are wall-clock, with a device synchronisation at the start, after the prefill and at the
    end; the decode loop feeds each token back on the device (no host read per step)."""
    b, p = prompts.shape
    device = prompts.device
    model.reset_cache()
    _sync(device)
    t0 = time.perf_counter()
    _new_step()
    logits = model(prompts, torch.arange(p, device=device))
    tok = logits[:, -1].argmax(-1)
    out = [tok]
    _sync(device)
    t1 = time.perf_counter()
    pos = torch.full((1,), p, dtype=torch.long, device=device)  # advanced in place: no host-to-device copy
    for _ in range(new_tokens - 1):
        _new_step()
        logits = model(tok[:, None], pos)
        tok = logits[:, -1].argmax(-1)
        out.append(tok)
        pos.add_(1)
    _sync(device)
    t2 = time.perf_counter()
    return Generation(torch.stack(out, dim=1), t1 - t0, t2 - t1, b, p, new_tokens)


def _new_step() -> None:
    """Each model call is a step of its own for Inductor's CUDA graphs (mode="reduce-overhead"): the
    previous call's outputs may be overwritten (the loop only keeps the argmax of the logits, computed
    outside the graph). Nothing happens without CUDA graphs."""
    torch.compiler.cudagraph_mark_step_begin()


def random_prompts(vocab: int, batch: int, prompt_len: int, seed: int = 0, device=None) -> torch.Tensor:
    """The same prompt batch on every rank (seeded, drawn on the CPU)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(vocab, (batch, prompt_len), generator=g)
    return t.to(device) if device is not None else t


__all__ = ["Generation", "generate", "random_prompts"]
