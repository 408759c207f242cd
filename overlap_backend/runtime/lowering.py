"""Registry of lowerings: for each op name, the function that runs it under each lowering.

A lowering module (``p2p.py``, the ``symm`` package's op modules) registers its implementations with
:func:`register`; ``ops.py`` dispatches through :func:`implementation`. The registry knows nothing
of FX graphs: the passes only store the lowering's name in the op's arguments.
"""

from __future__ import annotations

from collections.abc import Callable

_IMPLS: dict[str, dict[str, Callable]] = {}


class LoweringError(RuntimeError):
    """An op was asked to run under a lowering that does not implement it."""


def register(lowering: str, op: str) -> Callable[[Callable], Callable]:
    def deco(fn: Callable) -> Callable:
        table = _IMPLS.setdefault(lowering, {})
        if op in table:
            raise LoweringError(f"lowering {lowering!r} already implements {op!r}")
        table[op] = fn
        return fn

    return deco


def implementation(lowering: str, op: str) -> Callable:
    try:
        return _IMPLS[lowering][op]
    except KeyError:
        have = ", ".join(sorted(k for k, v in _IMPLS.items() if op in v)) or "none"
        raise LoweringError(
            f"overlap::{op} has no {lowering!r} lowering; lowerings that implement it: {have}"
        ) from None


def bound(impl: Callable) -> Callable:
    """``impl`` for the calls of one argument key (what ``ops.py`` caches per key): a lowering whose
    implementation keeps per-key state gives it a ``bind_key()`` that makes that state (symm: the
    key's private CUDA graphs)."""
    bind_key = getattr(impl, "bind_key", None)
    return impl if bind_key is None else bind_key()


def available(op: str | None = None) -> tuple[str, ...]:
    """Lowerings registered (for ``op`` if given)."""
    return tuple(sorted(k for k, v in _IMPLS.items() if op is None or op in v))
