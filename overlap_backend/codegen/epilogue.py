"""Generated epilogues: Triton source written for one (spec, dtype), compiled from a file, cached.

``spec/epilogue.py`` defines what a spec means; this module writes the same steps as a
``@triton.jit`` function ::

    def epilogue(x, rows, cols, mask, N, P0, P1, P2, P3):   # x: the fp32 [BM, BN] accumulator tile
        x = x.to(tl.bfloat16).to(tl.float32)                # the GEMM's own rounding to its dtype
        x = x + tl.load(P0 + cols, ...)[None, :]            # bias:0
        ...                                                 # one block per step, rounded to the
        return x                                            # current dtype after each, as eager does

``rows`` are the tile's rows in the op's output (int), ``cols`` its columns, ``P0..P3`` the
tensors the steps read (``epilogue_args``, or other outputs for ``swiglu``), each contiguous
``[rows, N]`` (or ``[N]`` for a bias). The symm GEMM kernels take the function as a ``tl.constexpr``
argument (``EPILOGUE``) and call it in their store path; the module also holds a pointwise kernel
(``pointwise_kernel``) that applies the epilogue to a finished tensor (``mm_ar``'s rounds path, where
the reduced rows of other ranks arrive by copy engine, and the tests).

Cache: the source goes to ``cache_path("kernels")/epilogue_<key>.py`` (under ``OVERLAP_CACHE_DIR``,
see :mod:`overlap_backend.spec.cache`), ``key`` = sha256 of the source, torch's and Triton's
versions, the GPU's name and the knobs' hash; the module is imported from that file (``triton.jit``
reads a function's source from its file) and kept in memory. Triton's own on-disk cache keys compiled
binaries by the function's source, so a second process that loads the same file compiles nothing.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from ..spec import epilogue as spec_mod
from ..spec import knobs
from ..spec.cache import cache_path
from . import launcher

MAX_POINTERS = 4  # P0..P3: tensors one epilogue may read
_TL_DTYPES = {torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16"}


class Unsupported(ValueError):
    """The spec/dtype cannot be generated (the lowering then applies the reference instead)."""


@dataclass(frozen=True)
class Generated:
    spec: str
    dtype: torch.dtype
    source: str
    key: str
    path: Path
    module: object
    slots: tuple[tuple[str, int], ...]  # P<i> reads ("arg", k): epilogue_args[k] or ("out", j): outs[j]

    @property
    def fn(self):
        return self.module.epilogue

    @property
    def pointwise(self):
        return self.module.pointwise_kernel

    @property
    def reduce(self):
        return self.module.reduce_kernel


def _round(dtype: torch.dtype) -> list[str]:
    if dtype == torch.float32:
        return []
    return [f"x = x.to({_TL_DTYPES[dtype]}).to(tl.float32)"]


def emit(spec: str, dtype: torch.dtype) -> tuple[str, tuple[tuple[str, int], ...]]:
    """Triton source of the epilogue of ``spec`` on a ``dtype`` GEMM output; and its pointer slots."""
    steps = spec_mod.parse(spec)
    if dtype not in _TL_DTYPES:
        raise Unsupported(f"dtype {dtype} (generated epilogues: {', '.join(map(str, _TL_DTYPES))})")
    slots: list[tuple[str, int]] = []

    def slot(kind: str, index: int) -> str:
        if (kind, index) not in slots:
            if len(slots) == MAX_POINTERS:
                raise Unsupported(f"epilogue {spec!r} reads more than {MAX_POINTERS} tensors")
            slots.append((kind, index))
        return f"P{slots.index((kind, index))}"

    body = _round(dtype) if steps else []
    cur = dtype
    for s in steps:
        body.append(f"# {s}")
        if s.kind == "bias":
            p = slot("arg", s.param)
            body.append(f"x = x + tl.load({p} + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]")
        elif s.kind == "add":
            p = slot("arg", s.param)
            body.append(f"x = x + tl.load({p} + offs, mask=mask, other=0.0).to(tl.float32)")
        elif s.kind == "gelu":
            body.append("x = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))")
        elif s.kind == "gelu_tanh":
            body.append("inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)")
            body.append("x = 0.5 * x * (1.0 + (2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0))  # tanh(inner)")
        elif s.kind == "silu":
            body.append("x = x / (1.0 + tl.exp(-x))")
        elif s.kind == "swiglu":
            p = slot("out", s.param)
            body.append(f"x = x / (1.0 + tl.exp(-x)) * tl.load({p} + offs, mask=mask, other=0.0).to(tl.float32)")
        elif s.kind == "mul":
            body.append(f"x = x * {float(s.param)!r}")
        elif s.kind == "cast":
            if s.param not in _TL_DTYPES:
                raise Unsupported(f"epilogue {spec!r}: cast to {s.param}")
            cur = s.param
        body += _round(cur)
    params = ", ".join(f"P{i}" for i in range(MAX_POINTERS))
    lines = [
        f'"""Generated by overlap_backend.codegen.epilogue: spec {spec!r} on a {dtype} GEMM output."""',
        "import triton",
        "import triton.language as tl",
        "",
        "",
        "@triton.jit",
        f"def epilogue(x, rows, cols, mask, N, {params}):",
        f"    # spec: {spec or '(no steps)'}",
        "    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]",
        *("    " + line for line in body),
        "    return x",
        "",
        "",
        "@triton.jit",
        f"def pointwise_kernel(x_ptr, out_ptr, M, N, {params}, BM: tl.constexpr, BN: tl.constexpr):",
        '    """out[M, N] = epilogue(x[M, N]) (x already rounded to the GEMM dtype)."""',
        "    rows = tl.program_id(0) * BM + tl.arange(0, BM)",
        "    cols = tl.program_id(1) * BN + tl.arange(0, BN)",
        "    mask = (rows < M)[:, None] & (cols < N)[None, :]",
        "    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]",
        "    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)",
        f"    x = epilogue(x, rows, cols, mask, N, {params})",
        "    tl.store(out_ptr + offs, x.to(out_ptr.dtype.element_ty), mask=mask)",
        "",
        "",
        "@triton.jit",
        f"def reduce_kernel(slots_ptr, out_ptr, WS, slot_stride, row0, M, N, scale, {params}, BM: tl.constexpr, "
        "BN: tl.constexpr):",
        '    """out[row0 + i] = epilogue(scale * (sum of the WS slots[s, row0 + i])) for i < M; slots: WS',
        "    [rows, N] partials slot_stride elements apart, rows numbered as the op's output (summed in",
        '    float32 and rounded once, as torch.sum over the slots)."""',
        "    rows = row0 + tl.program_id(0) * BM + tl.arange(0, BM)",
        "    cols = tl.program_id(1) * BN + tl.arange(0, BN)",
        "    mask = (rows < row0 + M)[:, None] & (cols < N)[None, :]",
        "    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]",
        "    src = slots_ptr + offs",
        "    x = tl.zeros((BM, BN), dtype=tl.float32)",
        "    for _ in range(WS):",
        "        x += tl.load(src, mask=mask, other=0.0).to(tl.float32)",
        "        src += slot_stride",
        f"    x = epilogue(x * scale, rows, cols, mask, N, {params})",
        "    tl.store(out_ptr + offs, x.to(out_ptr.dtype.element_ty), mask=mask)",
        "",
    ]
    return "\n".join(lines), tuple(slots)


def _device_name() -> str:
    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return torch.cuda.get_device_name()
    return "interpreter"


def cache_dir() -> Path:
    return cache_path("kernels")


_lock = threading.Lock()
_memory: dict[str, Generated] = {}  # by cache key (source, versions, GPU, knobs)
# by (spec, dtype, TRITON_INTERPRET): skips emit and hashing; the source depends on no knob, so a
# knob patched later finds the same code here
_built: dict[tuple, Generated] = {}
STATS = {"generated": 0, "memory_hits": 0, "disk_hits": 0}  # this process's builds (tests read them)


def reset_stats() -> None:
    """Zero :data:`STATS` (in place: readers holding the dict see the reset)."""
    for k in STATS:
        STATS[k] = 0


def cache_key(source: str) -> str:
    import triton

    ident = (f"{source}\ntorch {torch.__version__}\ntriton {triton.__version__}\ngpu {_device_name()}"
             f"\nknobs {knobs.knobs_hash()}")
    return hashlib.sha256(ident.encode()).hexdigest()


def build(spec: str, dtype: torch.dtype) -> Generated:
    """The generated epilogue of ``spec`` on ``dtype`` (memory cache, then the file cache)."""
    # Every launch asks (the identity epilogue included): writing and hashing the source again
    # cost ~15-25 us of host time per launch, which decode-size ops cannot spare.
    known = _built.get((spec, dtype, os.environ.get("TRITON_INTERPRET")))
    if known is not None:
        STATS["memory_hits"] += 1
        return known
    gen = _build(spec, dtype)
    _built[(spec, dtype, os.environ.get("TRITON_INTERPRET"))] = gen
    return gen


def _build(spec: str, dtype: torch.dtype) -> Generated:
    source, slots = emit(spec, dtype)
    key = cache_key(source)
    with _lock:
        if key in _memory:
            STATS["memory_hits"] += 1
            return _memory[key]
        path = cache_dir() / f"epilogue_{key[:24]}.py"
        if path.exists() and path.read_text() == source:
            STATS["disk_hits"] += 1
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(source)
            os.replace(tmp, path)
            STATS["generated"] += 1
        name = f"overlap_backend_generated.epilogue_{key[:24]}"
        loader = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(loader)
        sys.modules[name] = module
        loader.loader.exec_module(module)
        gen = Generated(spec, dtype, source, key, path, module, slots)
        _memory[key] = gen
        return gen


def pointers(gen: Generated, args, outs=()) -> list:
    """The tensors for ``P0..P3`` (contiguous), padded with the first one (or ``None``)."""
    ptrs = []
    for kind, index in gen.slots:
        t = args[index] if kind == "arg" else outs[index]
        ptrs.append(t.contiguous())
    pad = ptrs[0] if ptrs else None
    return ptrs + [pad] * (MAX_POINTERS - len(ptrs))


def apply_pointwise(gen: Generated, x: torch.Tensor, args, outs=(), out=None) -> torch.Tensor:
    """``epilogue(x)`` with the generated pointwise kernel (``x`` [M, N] contiguous)."""
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    m, n = x2.shape
    if out is None:
        out = torch.empty((m, n), dtype=spec_mod.out_dtype(gen.spec, x.dtype), device=x.device)
    ptrs = [p if p is not None else x2 for p in pointers(gen, args, outs)]
    bm, bn = 32, 64
    launcher.launch(gen.pointwise, (launcher.cdiv(m, bm), launcher.cdiv(n, bn)), x2, out, m, n, *ptrs, BM=bm, BN=bn)
    return out.view(*x.shape[:-1], n)


def apply_reduce(gen: Generated, slots: torch.Tensor, out: torch.Tensor, row0: int, rows: int, scale: float,
                 ptrs) -> None:
    """``out[row0 : row0 + rows] = epilogue(scale * slots.sum(0)[row0 : row0 + rows])`` in one kernel:
    ``slots`` [ws, R, N] and ``out`` [R, N] contiguous, rows numbered as the op's output (what the
    epilogue's ``add`` steps read); ``ptrs``: ``pointers(gen, ...)``."""
    ws, _, n = slots.shape
    if not rows:
        return
    ptrs = [p if p is not None else out for p in ptrs]
    bm, bn = 32, 64
    launcher.launch(gen.reduce, (launcher.cdiv(rows, bm), launcher.cdiv(n, bn)), slots, out, ws, slots.stride(0),
                    row0, rows, n, scale, *ptrs, BM=bm, BN=bn)


def epilogue_fn(gen: Generated | None, ptrs, dtype: torch.dtype, dummy: torch.Tensor):
    """``(EPILOGUE, [ep0..ep3])`` for a kernel launch: the generated function (the identity one for
    ``gen`` None) and its pointers, unused ones set to ``dummy``."""
    if gen is None:
        gen = build("", dtype if dtype in _TL_DTYPES else torch.float32)
        ptrs = ()
    ptrs = [p if p is not None else dummy for p in ptrs] + [dummy] * (MAX_POINTERS - len(ptrs))
    return gen.fn, ptrs
