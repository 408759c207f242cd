"""Named sets of tunables: read as attributes, changed only through :meth:`Knobs.patch` (tests, probes)
or :meth:`Knobs.set` (a benchmark's ``--set``), hashed into every cache key.

A tunable is a value the code was measured with, not user configuration (that is
:class:`~overlap_backend.config.OverlapConfig`): tile configs, thresholds between two code paths,
schedule choices. Each subsystem declares its set once; every reader (the runtime, the kernels' launch
code, the cost model that prices them) reads the same attribute, so a patched value changes the code
and its price together.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
from collections.abc import Iterator, Mapping
from typing import Any

_SETS: dict[str, Knobs] = {}


class Knobs:
    """One subsystem's tunables, declared with their defaults: ``Knobs("cta", K_CHUNKS=4)``."""

    def __init__(self, name: str, **defaults: Any):
        if name in _SETS:
            raise ValueError(f"knob set {name!r} is declared twice")
        lower = [k for k in defaults if not k.isupper()]
        if lower:  # UPPERCASE names never shadow the set's methods
            raise ValueError(f"knob names are UPPERCASE: {', '.join(lower)}")
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_defaults", dict(defaults))
        object.__setattr__(self, "_values", {})
        self._store(defaults)
        _SETS[name] = self

    def _store(self, values: Mapping[str, Any]) -> None:
        # Knobs are plain instance attributes, so a read on a launch path costs one attribute lookup.
        _GENERATION[0] += 1
        self._values.update(values)
        for key, value in values.items():
            object.__setattr__(self, key, value)

    def __getattr__(self, key: str) -> Any:  # only reached for a name that is not a knob
        raise AttributeError(f"knob set {self._name!r} has no knob {key!r}")

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"knobs are changed with {self._name}.patch({key}=...) or .set(...), not by assignment")

    def __repr__(self) -> str:
        return f"Knobs({self._name!r}, {', '.join(f'{k}={v!r}' for k, v in self._values.items())})"

    @property
    def name(self) -> str:
        return self._name

    def values(self) -> dict[str, Any]:
        return dict(self._values)

    def defaults(self) -> dict[str, Any]:
        return dict(self._defaults)

    def _checked(self, values: Mapping[str, Any]) -> dict[str, Any]:
        for key, value in values.items():
            if key not in self._defaults:
                raise KeyError(f"knob set {self._name!r} has no knob {key!r}; knobs: {', '.join(self._defaults)}")
            default = self._defaults[key]
            if default is None or value is None:
                continue
            same = type(value) is type(default) or (isinstance(default, float) and type(value) is int)
            if not same and not (isinstance(default, tuple) and isinstance(value, list)):
                raise TypeError(f"{self._name}.{key} = {value!r}: expected a {type(default).__name__} like its "
                                f"default {default!r}")
        return {k: tuple(v) if isinstance(v, list) and isinstance(self._defaults[k], tuple) else v
                for k, v in values.items()}

    def set(self, **values: Any) -> None:
        """Change knobs for the rest of the process (a benchmark's ``--set``)."""
        self._store(self._checked(values))

    @contextlib.contextmanager
    def patch(self, **values: Any) -> Iterator[Knobs]:
        """Change knobs inside a ``with`` block (or as a decorator); the old values come back on exit."""
        checked = self._checked(values)
        old = {k: self._values[k] for k in checked}
        self._store(checked)
        try:
            yield self
        finally:
            self._store(old)


_GENERATION = [0]  # bumped by every change of any knob


def generation() -> int:
    """A number that changes whenever any knob changes: what per-call caches of decisions made from knobs
    (the symm op plans) are keyed by, instead of the knobs' values."""
    return _GENERATION[0]


def knob_sets() -> dict[str, Knobs]:
    return dict(_SETS)


def _split(dotted: str) -> tuple[Knobs, str]:
    name, _, key = dotted.partition(".")
    if name not in _SETS or not key:
        raise KeyError(f"{dotted!r} is not <set>.<KNOB>; sets: {', '.join(sorted(_SETS))}")
    return _SETS[name], key


@contextlib.contextmanager
def patch(values: Mapping[str, Any]) -> Iterator[None]:
    """Patch knobs of several sets at once: ``patch({"cta.K_CHUNKS": 8, "symm.BAND_ROWS_MIN": 256})``."""
    with contextlib.ExitStack() as stack:
        for dotted, value in values.items():
            knobs, key = _split(dotted)
            stack.enter_context(knobs.patch(**{key: value}))
        yield


def set_from_text(assignment: str) -> tuple[str, Any]:
    """Apply ``"<set>.<KNOB>=<python literal>"`` (a bench's ``--set``; a bare word is a string)."""
    dotted, eq, raw = assignment.partition("=")
    if not eq:
        raise ValueError(f"{assignment!r} is not <set>.<KNOB>=<value>")
    knobs, key = _split(dotted.strip())
    try:
        value = ast.literal_eval(raw.strip())
    except (ValueError, SyntaxError):
        value = raw.strip()
    knobs.set(**{key: value})
    return dotted.strip(), value


def knobs_hash() -> str:
    """A digest of every knob's current value: part of every cache key, so a patched knob never reuses
    what was tuned, compiled or calibrated under another value."""
    text = repr(sorted((name, sorted(k.values().items())) for name, k in _SETS.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
