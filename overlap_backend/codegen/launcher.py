"""Kernel launches, and *preloading*: compiling and loading every kernel of an op call before the
call enqueues anything that waits on another rank or another kernel.

Why: the first launch of a Triton kernel variant compiles it and loads its module
(``cuModuleLoadData`` + ``cuFuncGetAttribute``). With CUDA's lazy loading, loading a kernel may
synchronise the context (CUDA programming guide, "Lazy Loading: concurrent execution"). A context
synchronisation in the middle of an op call waits for everything already queued, including

- a stream wait (``cuStreamWaitValue32``) on a flag that a late peer raises: the host stalls
  until the peer arrives, so this rank's kernel starts only then and its bounded wait never
  fires (seen on 2×H200: the late-peer test of ``ag_mm`` never timed out);
- a persistent kernel that spins until a kernel launched after it finishes (``moe_experts``: the
  communication consumer waits for the expert GEMMs): a deadlock until the bounded wait gives
  up (seen on 2×H200: the consumer timed out waiting for its own GEMM's tiles).

A variant is compiled not only for a new shape: Triton specialises integer arguments equal to 1
and divisible by 16, and pointers by alignment. Per-call scalars (the epoch, row offsets) are
therefore ``do_not_specialize`` in the kernels, and every lowering runs its launches once inside
``preloading()`` before ``GroupState.begin``: there they only compile and load (no launch).
Preloading costs as much host time as a launch (Triton's argument binding and cache lookup), so
it is skipped for a variant preloaded before: ``_variant_key`` classifies the arguments at least
as finely as Triton's specialisation does (dtype and 16-byte alignment of pointers; integers
equal to 0 or 1, divisible by 16, beyond 32 bits; the constexprs and launch options), so a
variant it has seen is one Triton has compiled and loaded.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from typing import NamedTuple

import torch

from ..spec import knobs

_state = threading.local()
_preloaded: set = set()


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@contextlib.contextmanager
def preloading():
    """Inside: ``launch`` compiles and loads the kernel variant it would launch, and launches nothing."""
    prev = getattr(_state, "preload", False)
    _state.preload = True
    try:
        yield
    finally:
        _state.preload = prev


def is_preloading() -> bool:
    """Inside ``preloading()`` (callers that also queue non-Triton work skip it there)."""
    return getattr(_state, "preload", False)


def cdiv(a: int, b: int) -> int:
    """Ceiling division for host code (grids, row counts): ``triton.cdiv`` is a constexpr function,
    whose call from Python costs microseconds (argument unwrapping), several times per op call."""
    return -(-a // b)


class Persistent(NamedTuple):
    """The grid of a persistent kernel: one CTA per tile, at most ``per_sm`` CTAs on each of ``sms`` SMs and
    no more than one SM holds at once (the compiled variant's registers, shared memory and threads decide)."""

    tiles: int
    sms: int
    per_sm: int = 1


def launch(kernel, grid, *args, **kwargs):
    """``kernel[grid](*args, **kwargs)``, or, inside ``preloading()``, its compilation and loading.
    ``grid`` may be a ``Persistent``."""
    if getattr(_state, "preload", False):
        if interpreting():
            return None
        key = _variant_key(kernel, args, kwargs)
        if key not in _preloaded:
            _load(kernel, (1,) if isinstance(grid, Persistent) else grid, args, kwargs)
            _preloaded.add(key)
        return None
    key = None
    if isinstance(grid, Persistent):
        if grid.per_sm > 1 and not interpreting():
            key = _variant_key(kernel, args, kwargs)
            per_sm = min(grid.per_sm, _resident(key, kernel, args, kwargs))
        else:
            per_sm = 1
        grid = (max(1, min(grid.tiles, grid.sms * per_sm)),)
    if not knobs.codegen.FAST_LAUNCH or interpreting() or _launch_hooks():
        return kernel[grid](*args, **kwargs)
    key = key or _variant_key(kernel, args, kwargs)
    fast = _fast_launches.get(key)
    if fast is None:  # first launch of this variant: Triton's own path (binds, compiles if needed, launches)
        compiled = kernel[grid](*args, **kwargs)
        _fast_launches[key] = _FastLaunch.of(kernel, compiled, len(args), kwargs)
        return compiled
    if fast is _NO_FAST_LAUNCH:
        return kernel[grid](*args, **kwargs)
    fast(grid, args, kwargs)
    return fast.compiled


def _load(kernel, grid, args, kwargs):
    """Compile (if needed) and load the variant ``kernel(*args, **kwargs)`` would launch; returns it."""
    compiled = kernel.warmup(*args, grid=grid, **kwargs)
    init = getattr(compiled, "_init_handles", None)  # loads the module (Triton 3.x)
    if init is not None:
        init()
    return compiled


_resident_cache: dict = {}


def _resident(key, kernel, args, kwargs) -> int:
    """How many CTAs of the variant ``key`` one SM holds at once (cached per variant)."""
    per_sm = _resident_cache.get(key)
    if per_sm is None:
        compiled = _load(kernel, (1,), args, kwargs)
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        per_sm = resident_per_sm(compiled.metadata.shared, compiled.n_regs, compiled.metadata.num_warps, props)
        _resident_cache[key] = per_sm
    return per_sm


def resident_per_sm(shared: int, regs_per_thread: int, warps: int, props) -> int:
    """CTAs of a kernel one SM holds at once: its dynamic shared memory (bytes, plus the 1 KiB the driver
    reserves per CTA), registers (allocated per warp in units of 256) and threads against the SM's
    (``props``: CUDA device properties; Hopper's where a field is missing). At least 1."""
    smem = getattr(props, "shared_memory_per_multiprocessor", 233472)
    regs = getattr(props, "regs_per_multiprocessor", 65536)
    threads = getattr(props, "max_threads_per_multi_processor", 2048)
    by_smem = smem // (shared + 1024)
    by_regs = regs // (cdiv(max(1, regs_per_thread) * 32, 256) * 256 * warps)
    return max(1, min(by_smem, by_regs, threads // (32 * warps)))


# Triton's ``kernel[grid](...)`` binds every argument, specialises it (alignment, ==1, %16), looks
# the variant up in its cache and checks the kernel's globals on every launch: tens of microseconds
# for our 30-40-argument kernels, several times per op call, where eager calls at decode sizes are
# host-bound. A variant ``_variant_key`` has seen is one Triton has compiled (see above), so later
# launches of it call the compiled kernel's launcher directly with the same argument list Triton
# builds (every parameter in order, defaults filled in). Off (``knobs.codegen.FAST_LAUNCH`` False), under
# the interpreter and while Triton's launch hooks are set (profilers such as proton use them).
_fast_launches: dict = {}
_NO_FAST_LAUNCH = object()


def _launch_hooks() -> bool:
    try:
        from triton import knobs as triton_knobs
    except ImportError:  # Triton < 3.4 has no knobs: keep its own launch path
        return True
    return _hook_set(triton_knobs.runtime.launch_enter_hook) or _hook_set(triton_knobs.runtime.launch_exit_hook)


def _hook_set(hook) -> bool:
    """A hook (a function before Triton 3.5; since then a chain, always there, that may be empty)."""
    calls = getattr(hook, "calls", None)
    return bool(calls) if calls is not None else hook is not None


def _current_stream() -> int:
    """The current CUDA stream's handle (what Triton launches on)."""
    return torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())


class _FastLaunch:
    """A compiled variant's launcher, called as ``JITFunction.run`` calls it."""

    def __init__(self, compiled, run, tail_names, defaults):
        self.compiled, self.run, self.tail_names, self.defaults = compiled, run, tail_names, defaults
        self.function, self.metadata = compiled.function, compiled.packed_metadata

    @classmethod
    def of(cls, kernel, compiled, npos: int, kwargs):
        """The fast launch of ``compiled`` (what ``kernel[grid](...)`` returned for ``npos`` positional
        arguments and these keywords), or ``_NO_FAST_LAUNCH`` where this Triton differs from the
        layout assumed here (then every launch takes Triton's path)."""
        try:
            names = [p.name for p in kernel.params]
            params = kernel.signature.parameters
            if not all(k in params or k in _LAUNCH_OPTIONS for k in kwargs):
                return _NO_FAST_LAUNCH
            tail = names[npos:]
            defaults = {n: params[n].default for n in tail if params[n].default is not params[n].empty}
            if any(n not in kwargs and n not in defaults for n in tail):
                return _NO_FAST_LAUNCH
            return cls(compiled, compiled.run, tail, defaults)
        except AttributeError:
            return _NO_FAST_LAUNCH

    def __call__(self, grid, args, kwargs):
        vals = list(args)
        for n in self.tail_names:
            vals.append(kwargs[n] if n in kwargs else self.defaults[n])
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        self.run(grid[0], g1, g2, _current_stream(), self.function, self.metadata, None, None, None, *vals)


# Keywords of a launch that are compile options, not kernel parameters (Triton's backend options).
_LAUNCH_OPTIONS = frozenset({"num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion",
                             "launch_cooperative_grid", "launch_pdl", "debug"})


def _variant_key(kernel, args, kwargs) -> tuple:
    # On every launch (the fast path's lookup): exact type tests first, as ints, tensors and None
    # are most arguments. The keywords' order is the caller's (another order only makes another entry).
    sig = []
    for a in args:
        t = type(a)
        if t is bool or a is None:
            sig.append(a)
        elif t is int or isinstance(a, int):  # int subclasses (numpy, enums) are classified like ints
            sig.append(("int", a == 0, a == 1, a % 16 == 0, not -(2**31) <= a < 2**31))
        elif hasattr(a, "data_ptr"):
            sig.append((getattr(a, "dtype", None), a.data_ptr() % 16 == 0))
        else:
            sig.append(t)
    device = torch.cuda.current_device() if _cuda_available() else -1
    return (kernel, device, tuple(sig), tuple(kwargs.items()))


@functools.cache
def _cuda_available() -> bool:
    return torch.cuda.is_available()
