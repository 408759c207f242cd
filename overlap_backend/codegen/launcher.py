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
import os
import threading

import torch

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


def launch(kernel, grid, *args, **kwargs):
    """``kernel[grid](*args, **kwargs)``, or, inside ``preloading()``, its compilation and loading."""
    if getattr(_state, "preload", False):
        if interpreting():
            return None
        key = _variant_key(kernel, args, kwargs)
        if key not in _preloaded:
            compiled = kernel.warmup(*args, grid=grid, **kwargs)
            init = getattr(compiled, "_init_handles", None)  # loads the module (Triton 3.x)
            if init is not None:
                init()
            _preloaded.add(key)
        return None
    return kernel[grid](*args, **kwargs)


def _variant_key(kernel, args, kwargs) -> tuple:
    sig = []
    for a in args:
        if hasattr(a, "data_ptr"):
            sig.append((getattr(a, "dtype", None), a.data_ptr() % 16 == 0))
        elif isinstance(a, bool) or a is None:
            sig.append(a)
        elif isinstance(a, int):
            sig.append(("int", a == 0, a == 1, a % 16 == 0, not -(2**31) <= a < 2**31))
        else:
            sig.append(type(a))
    device = torch.cuda.current_device() if torch.cuda.is_available() else -1
    return (kernel, device, tuple(sig), tuple(sorted(kwargs.items(), key=lambda kv: kv[0])))
