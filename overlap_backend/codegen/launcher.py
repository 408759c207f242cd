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
Cost: Triton's argument binding and cache lookup run twice per launch (once to preload, once to
launch), host time not measured yet; a memo keyed by Triton's specialisation would have to
re-derive that key, which is what the lookup does.
"""

from __future__ import annotations

import contextlib
import os
import threading

_state = threading.local()


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
        if not interpreting():
            compiled = kernel.warmup(*args, grid=grid, **kwargs)
            init = getattr(compiled, "_init_handles", None)  # loads the module (Triton 3.x)
            if init is not None:
                init()
        return None
    return kernel[grid](*args, **kwargs)
