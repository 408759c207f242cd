"""Epilogues: the pointwise steps a pass captured after a GEMM-collective op, as one spec string.

This module is the ONE place that defines what an epilogue means, below the three layers that share
it: the passes write specs, the ops' fake implementations take output dtypes from :func:`out_dtype`,
the ``p2p`` lowering (and every fallback) runs :func:`apply` (plain torch, so CPU/gloo runs compute
exactly what the graph's own nodes computed), and ``codegen/epilogue.py`` turns the same parsed steps
into Triton source.

A spec is a comma-separated list of steps, applied in order to the op's output ``x`` (``mm_rs``: the
reduced chunk; ``mm_ar``: the all-reduced result; ``ag_mm``: each ``outs[i]``, its ``epilogue``
argument holding one spec per output joined by ``|``, e.g. ``"bias:0,gelu|"``)::

    bias:K        x = x + args[K]              args[K]: [N] (or [1, ..., 1, N]), broadcast over rows
    add:K         x = x + args[K]              args[K]: exactly x's elements (the residual; for mm_rs the
                                               matching row chunk, i.e. the op's output shape)
    gelu          x = gelu(x)                  (erf form)
    gelu_tanh     x = gelu(x, approximate="tanh")
    silu          x = silu(x)
    swiglu:J      x = silu(x) * outs[J]        ag_mm only: outs[J] is output J of the same op, after
                                               its own epilogue, which must not itself read an output
    mul:S         x = x * S                    S: a float literal (Python repr)
    cast:D        x = x.to(D)                  D: float32 | float16 | bfloat16 | float64

Every step computes in ``x``'s current dtype, as the graph's eager ops did (a bf16 ``add`` rounds
to bf16); ``cast`` changes it. Tensor arguments must have ``x``'s current dtype (no promotion).
Example: ``bias:0,gelu,cast:bfloat16``; the empty spec is "no epilogue".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

STEPS = ("bias", "add", "gelu", "gelu_tanh", "silu", "swiglu", "mul", "cast")
_TAKES_ARG = ("bias", "add")  # the parameter is an index into epilogue_args
_TAKES_OUT = ("swiglu",)  # the parameter is an index into the op's outputs
_NO_PARAM = ("gelu", "gelu_tanh", "silu")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


class EpilogueError(ValueError):
    """A spec that does not parse, or arguments that do not fit it."""


@dataclass(frozen=True)
class Step:
    kind: str
    param: int | float | torch.dtype | None = None

    def __str__(self) -> str:
        if self.param is None:
            return self.kind
        if self.kind == "cast":
            return f"cast:{DTYPE_NAMES[self.param]}"
        if self.kind == "mul":
            return f"mul:{float(self.param)!r}"
        return f"{self.kind}:{self.param}"


def parse(spec: str) -> tuple[Step, ...]:
    """The steps of ``spec`` (see the module docstring); :class:`EpilogueError` names a bad one."""
    if not isinstance(spec, str):
        raise EpilogueError(f"epilogue spec {spec!r} is not a string")
    steps = []
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            if spec.strip():
                raise EpilogueError(f"epilogue {spec!r}: empty step")
            continue
        kind, _, param = item.partition(":")
        if kind not in STEPS:
            raise EpilogueError(f"epilogue {spec!r}: unknown step {kind!r}; allowed: {', '.join(STEPS)}")
        if kind in _NO_PARAM:
            if param:
                raise EpilogueError(f"epilogue {spec!r}: step {kind!r} takes no parameter")
            steps.append(Step(kind))
        elif kind in _TAKES_ARG + _TAKES_OUT:
            if not param.isdigit():
                raise EpilogueError(f"epilogue {spec!r}: step {kind!r} needs an index (e.g. {kind}:0), got {param!r}")
            steps.append(Step(kind, int(param)))
        elif kind == "mul":
            try:
                value = float(param)
            except ValueError:
                raise EpilogueError(f"epilogue {spec!r}: mul needs a float, got {param!r}") from None
            if not math.isfinite(value):
                raise EpilogueError(f"epilogue {spec!r}: mul by {param!r} (not finite)")
            steps.append(Step(kind, value))
        else:  # cast
            if param not in DTYPES:
                raise EpilogueError(f"epilogue {spec!r}: cast to {param!r}; allowed: {', '.join(DTYPES)}")
            steps.append(Step(kind, DTYPES[param]))
    return tuple(steps)


def split_outputs(epilogue: str, outputs: int) -> list[str]:
    """``ag_mm``'s ``epilogue``: one spec per output joined by ``|`` (``""``: none at all)."""
    if not epilogue:
        return []
    specs = epilogue.split("|")
    if len(specs) != outputs:
        raise EpilogueError(f"epilogue {epilogue!r} has {len(specs)} '|'-separated specs for {outputs} outputs")
    return specs


def format_spec(steps: Sequence[Step]) -> str:
    return ",".join(str(s) for s in steps)


def out_dtype(spec: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype of an output of ``dtype`` after ``spec``."""
    for s in parse(spec):
        if s.kind == "cast":
            dtype = s.param
    return dtype


def arg_indices(spec: str) -> list[int]:
    return [s.param for s in parse(spec) if s.kind in _TAKES_ARG]


def out_refs(spec: str) -> list[int]:
    return [s.param for s in parse(spec) if s.kind in _TAKES_OUT]


def check(specs: Sequence[str], args: Sequence[Optional[Tensor]], shapes: Sequence[Sequence[int]],
          dtypes: Sequence[torch.dtype], allow_out_refs: bool) -> None:
    """Raise :class:`EpilogueError` unless ``specs[i]`` fits output i (``shapes[i]``, ``dtypes[i]``)
    and ``args``: indices in range, argument shapes and dtypes as the steps need."""
    used = set()
    for i, (spec, shape, dtype) in enumerate(zip(specs, shapes, dtypes)):
        n = shape[-1] if len(shape) else 1
        numel = math.prod(shape)
        for s in parse(spec):
            if s.kind in _TAKES_ARG:
                if s.param >= len(args) or args[s.param] is None:
                    raise EpilogueError(f"epilogue {spec!r}: {s} but epilogue_args has {len(args)} tensors")
                a = args[s.param]
                used.add(s.param)
                if a.dtype != dtype:
                    raise EpilogueError(f"epilogue {spec!r}: {s} is {a.dtype}, the value is {dtype} at that step")
                if s.kind == "bias" and (a.numel() != n or (a.dim() and a.shape[-1] != n)):
                    raise EpilogueError(f"epilogue {spec!r}: {s} has shape {tuple(a.shape)}, expected [{n}]")
                if s.kind == "add" and (a.numel() != numel or (a.dim() and a.shape[-1] != n)):
                    raise EpilogueError(
                        f"epilogue {spec!r}: {s} has shape {tuple(a.shape)}, expected the output's {numel} elements "
                        f"(last dim {n})")
            elif s.kind in _TAKES_OUT:
                j = s.param
                if not allow_out_refs:
                    raise EpilogueError(f"epilogue {spec!r}: {s} reads another output; only ag_mm has several")
                if j >= len(specs) or j == i:
                    raise EpilogueError(f"epilogue {spec!r} of output {i}: {s} names no other output")
                if out_refs(specs[j]):
                    raise EpilogueError(f"epilogue {spec!r} of output {i}: output {j}'s own epilogue reads an output")
                if tuple(shapes[j]) != tuple(shape) or out_dtype(specs[j], dtypes[j]) != dtype:
                    raise EpilogueError(f"epilogue {spec!r} of output {i}: output {j} has another shape or dtype")
            elif s.kind == "cast":
                dtype = s.param


def _step(x: Tensor, s: Step, args: Sequence[Optional[Tensor]], outs: Sequence[Tensor]) -> Tensor:
    if s.kind == "bias":
        return x + args[s.param].reshape(x.shape[-1])
    if s.kind == "add":
        return x + args[s.param].reshape(x.shape)
    if s.kind == "gelu":
        return F.gelu(x)
    if s.kind == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if s.kind == "silu":
        return F.silu(x)
    if s.kind == "swiglu":
        return F.silu(x) * outs[s.param]
    if s.kind == "mul":
        return x * s.param
    return x.to(s.param)  # cast


def apply(spec: str, x: Tensor, args: Sequence[Optional[Tensor]], outs: Sequence[Tensor] = ()) -> Tensor:
    """``x`` after the steps of ``spec`` (the reference: plain torch, the graph's own semantics)."""
    for s in parse(spec):
        x = _step(x, s, args, outs)
    return x


def apply_all(specs: Sequence[str], outs: list[Tensor], args: Sequence[Optional[Tensor]]) -> list[Tensor]:
    """``ag_mm``'s outputs after their epilogues: first those that read no other output, then those
    that do (``swiglu:J`` reads output J's final value)."""
    if not specs:
        return outs
    if len(specs) != len(outs):
        raise EpilogueError(f"{len(specs)} epilogues for {len(outs)} outputs")
    res = list(outs)
    for i in sorted(range(len(outs)), key=lambda i: bool(out_refs(specs[i]))):
        if specs[i]:
            res[i] = apply(specs[i], outs[i], args, res)
    return res
