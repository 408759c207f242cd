"""Configuration of the overlap backend.

Every field of :class:`OverlapConfig` has one ``OVERLAP_*`` environment variable, parsed here and
nowhere else. Precedence: explicit argument (``make_backend(**overrides)``) > environment > default.
A bad value raises :class:`ConfigError` naming the variable (or argument) and the allowed values.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The passes that run by default, in the order the pass manager runs them. A pass name becomes
# valid when its module registers it in passes/__init__.py; cta_pipeline is registered but off by
# default: it runs when listed, or where the active cost model predicts a win and the passes were
# not named (``passes_named``).
# Every pass, in the order the pass manager runs them (tests check it against passes' registry, which
# config.py must not import: config sits below every pass).
PASS_NAMES = ("ag_mm", "mm_rs", "cta_pipeline", "moe_tp_experts", "mm_ar", "moe")
DEFAULT_PASS_ORDER = ("ag_mm", "mm_rs", "moe_tp_experts", "mm_ar", "moe")

log = logging.getLogger("overlap_backend")

# ``OVERLAP_*`` names that this package does not read but the project's own tests do.
OTHER_VARIABLE_PREFIXES = ("OVERLAP_TEST_",)
_warned_unknown: set[str] = set()  # each unknown name is warned about once per process

LOWERINGS = ("auto", "symm", "p2p")
# OverlapConfig fields that say only where files go: they never change a rewritten graph, and may differ per rank
PATH_FIELDS = ("debug_dir", "cache_dir")
COST_MODEL_MODES = ("auto", "on", "off")


class ConfigError(ValueError):
    """A configuration value is not one of the allowed values."""


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean; allowed: 1, 0, true, false, yes, no, on, off")


def _parse_bool_or_auto(name: str, raw: str | bool) -> bool | str:
    if isinstance(raw, bool):
        return raw
    if _is_auto(raw):
        return "auto"
    try:
        return _parse_bool(name, raw)
    except ConfigError:
        raise ConfigError(f"{name}={raw!r} is not a boolean; allowed: 1, 0, true, false, yes, no, on, off, auto") from None


def _parse_passes(name: str, raw: str | Sequence[str]) -> tuple[str, ...]:
    allowed = PASS_NAMES
    if isinstance(raw, str):
        items = [p.strip() for p in raw.split(",") if p.strip()]
        if raw.strip().lower() == "all":
            return tuple(allowed)
        if raw.strip().lower() == "default":
            return tuple(p for p in allowed if p in DEFAULT_PASS_ORDER)
    else:
        items = [str(p).strip() for p in raw]
    unknown = [p for p in items if p not in allowed]
    if unknown:
        raise ConfigError(
            f"{name}: unknown pass(es) {', '.join(map(repr, unknown))}; "
            f"allowed: {', '.join(allowed)} (comma-separated), or 'all'"
        )
    seen: list[str] = []
    for p in items:
        if p not in seen:
            seen.append(p)
    # The manager runs passes in its own fixed order whatever order the user listed them in.
    return tuple(p for p in allowed if p in seen)


def _parse_lowering(name: str, raw: str) -> str:
    value = raw.strip().lower()
    if value not in LOWERINGS:
        raise ConfigError(f"{name}={raw!r} is not a lowering; allowed: {', '.join(LOWERINGS)}")
    return value


def _parse_min_numel(name: str, raw: str | int) -> int:
    try:
        value = int(raw) if not isinstance(raw, float) else raw
        if isinstance(value, float):
            raise ValueError
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={raw!r} is not an integer; allowed: an integer >= 0") from None
    if value < 0:
        raise ConfigError(f"{name}={raw!r} is negative; allowed: an integer >= 0")
    return value


# The range of OVERLAP_TIMEOUT_S every transport can honour: torch truncates a wait's timedelta to whole
# milliseconds and takes 0 ms as "no timeout", and the symm kernels bound their waits by the timeout
# in int64 nanoseconds (2**63 ns is about 9.22e9 s; timedelta itself stops near 8.6e13 s).
TIMEOUT_MIN_S = 1e-3
TIMEOUT_MAX_S = 9.2e9


def _parse_timeout(name: str, raw: str | float | int) -> float:
    allowed = f"allowed: seconds from {TIMEOUT_MIN_S:g} to {TIMEOUT_MAX_S:g}"
    try:
        if isinstance(raw, bool):
            raise ValueError
        value = float(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={raw!r} is not a number; {allowed}") from None
    if not TIMEOUT_MIN_S <= value <= TIMEOUT_MAX_S:  # NaN fails both comparisons
        raise ConfigError(f"{name}={raw!r} is out of range; {allowed} (below 1 ms the transports would not "
                          f"time out at all)")
    return value


def _is_auto(raw: Any) -> bool:
    return isinstance(raw, str) and raw.strip().lower() == "auto"


def _int_or_auto(lo: int, hi: int | None = None):
    """A parser of an integer in ``[lo, hi]`` (no upper bound: ``hi`` None) or ``auto``."""
    allowed = (f"an integer >= {lo}" if hi is None else f"an integer from {lo} to {hi}") + ", or auto"

    def parse(name: str, raw: str | int) -> int | str:
        if _is_auto(raw):
            return "auto"
        try:
            if isinstance(raw, (bool, float)):
                raise ValueError
            value = int(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}={raw!r} is not an integer; allowed: {allowed}") from None
        if value < lo or (hi is not None and value > hi):
            raise ConfigError(f"{name}={raw!r} is out of range; allowed: {allowed}")
        return value

    return parse


_parse_cta_stages = _int_or_auto(1)
MOE_COMM_SMS_MAX = 64  # (the op's comm_sms argument is checked against it too: runtime/checks.py)
_parse_moe_comm_sms = _int_or_auto(0, MOE_COMM_SMS_MAX)


def _parse_cost_model(name: str, raw: str) -> str:
    value = raw.strip().lower() if isinstance(raw, str) else raw
    if value not in COST_MODEL_MODES:
        raise ConfigError(f"{name}={raw!r} is not a cost-model mode; allowed: {', '.join(COST_MODEL_MODES)}")
    return value


def _parse_debug_dir(name: str, raw: str | os.PathLike | None) -> str | None:
    if raw is None:
        return None
    value = os.fspath(raw).strip()
    return value or None


@dataclass(frozen=True)
class OverlapConfig:
    """What the backend does. Build it with :meth:`from_env` (or ``make_backend(**overrides)``)."""

    disable: bool = False
    """``OVERLAP_DISABLE``: behave exactly like plain Inductor."""

    passes: tuple[str, ...] = DEFAULT_PASS_ORDER
    """``OVERLAP_PASSES``: comma-separated passes that run, e.g. ``ag_mm,mm_rs``."""

    lowering: str = "auto"
    """``OVERLAP_LOWERING``: ``auto`` | ``symm`` | ``p2p``; how rewritten ops run."""

    inductor: bool = True
    """``OVERLAP_INDUCTOR``: ``0`` runs the rewritten ATen graph without Inductor codegen."""

    debug_dir: str | None = None
    """``OVERLAP_DEBUG_DIR``: where graph-diff dumps and ``summary.json`` go (off when unset)."""

    min_numel: int = 0
    """``OVERLAP_MIN_NUMEL``: leave a match alone when its matmul output has fewer elements
    (decomposing a tiny GEMM costs more launches than the overlap can win)."""

    timeout_s: float = 60.0
    """``OVERLAP_TIMEOUT_S``: how long a ``symm`` kernel waits for a peer's flag (and ``p2p`` for a
    transfer) before it gives up and the host raises an error naming the op, rank and flag (a dead
    or diverged peer). From ``TIMEOUT_MIN_S`` (1 ms) to ``TIMEOUT_MAX_S`` (9.2e9 s)."""

    cta_stages: int | str = 2
    """``OVERLAP_CTA_STAGES``: pipeline stages of the ``cta_pipeline`` op (``stages`` argument;
    the ``p2p`` lowering cuts the rows into that many micro-chunks). Never changes the result.
    ``auto``: the cost model picks it per match where it is active (else 2)."""

    fuse_epilogues: bool | str = "auto"
    """``OVERLAP_FUSE_EPILOGUES``: the ``ag_mm`` / ``mm_rs`` / ``mm_ar`` passes also capture the
    pointwise nodes after the GEMM (bias, GELU, SiLU, SwiGLU, scaling, residual add, cast) into the
    op's epilogue when every use allows it (see docs/codegen.md); ``0`` leaves them in the graph.
    ``auto`` (default): on for CPU tensors, off for CUDA ones, where the fused version measured
    slower than the unfused one (2×H200, the demo's TP block: 10.60 vs 9.47 ms per step)."""

    moe_comm_sms: int | str = 0
    """``OVERLAP_MOE_COMM_SMS``: SMs (CTAs) of the ``moe_experts`` symm communication kernel, which
    copies the expert results that come back into the output (and with ``knobs.moe.TRANSPORT = "sm"``
    ships finished expert segments to their source ranks) while the expert GEMMs run on the other
    SMs. ``0`` (default): no communication kernel; the copy engine does all of it and the GEMMs take
    every SM (measured faster on 2×H200, and immune to a slowdown the kernel showed after NCCL
    point-to-point traffic: docs/moe.md). The pass writes it into the op's ``comm_sms`` argument.
    ``auto``: the cost model picks it per match where it is active (else the op reads
    ``OVERLAP_MOE_COMM_SMS`` when it runs: 0 unless set)."""

    cost_model: str = "auto"
    """``OVERLAP_COST_MODEL``: ``auto`` | ``on`` | ``off``. ``on``: every match that passes its
    preconditions is rewritten only where the cost model (``cost/model.py``) predicts a win,
    with the lowering and knobs it picks; ``off``: every such match is rewritten (the behaviour
    before the model); ``auto``: ``on`` for matches on CUDA tensors, ``off`` on CPU (the CPU/gloo
    path exists for testing). See docs/cost_model.md."""

    cache_dir: str | None = None
    """``OVERLAP_CACHE_DIR``: root of the on-disk caches (the calibration files under
    ``calibration/``); default ``$XDG_CACHE_HOME/overlap_backend`` or ``~/.cache/overlap_backend``."""

    _ENV = {
        "disable": ("OVERLAP_DISABLE", _parse_bool),
        "passes": ("OVERLAP_PASSES", _parse_passes),
        "lowering": ("OVERLAP_LOWERING", _parse_lowering),
        "inductor": ("OVERLAP_INDUCTOR", _parse_bool),
        "debug_dir": ("OVERLAP_DEBUG_DIR", _parse_debug_dir),
        "min_numel": ("OVERLAP_MIN_NUMEL", _parse_min_numel),
        "timeout_s": ("OVERLAP_TIMEOUT_S", _parse_timeout),
        "cta_stages": ("OVERLAP_CTA_STAGES", _parse_cta_stages),
        "fuse_epilogues": ("OVERLAP_FUSE_EPILOGUES", _parse_bool_or_auto),
        "moe_comm_sms": ("OVERLAP_MOE_COMM_SMS", _parse_moe_comm_sms),
        "cost_model": ("OVERLAP_COST_MODEL", _parse_cost_model),
        "cache_dir": ("OVERLAP_CACHE_DIR", _parse_debug_dir),
    }

    def __post_init__(self):
        # A config built directly is held to the same rules as one parsed from the environment.
        if self.lowering not in LOWERINGS:
            raise ConfigError(f"lowering={self.lowering!r}; allowed: {', '.join(LOWERINGS)}")
        _parse_passes("passes", self.passes)
        if not isinstance(self.min_numel, int) or self.min_numel < 0:
            raise ConfigError(f"min_numel={self.min_numel!r}; allowed: an integer >= 0")
        _parse_timeout("timeout_s", self.timeout_s)
        if self.cta_stages != "auto" and (isinstance(self.cta_stages, bool) or not isinstance(self.cta_stages, int)
                                          or self.cta_stages < 1):
            raise ConfigError(f"cta_stages={self.cta_stages!r}; allowed: an integer >= 1, or 'auto'")
        if not isinstance(self.fuse_epilogues, bool) and self.fuse_epilogues != "auto":
            raise ConfigError(f"fuse_epilogues={self.fuse_epilogues!r}; allowed: True, False, 'auto'")
        if self.moe_comm_sms != "auto":
            _parse_moe_comm_sms("moe_comm_sms", self.moe_comm_sms)
        _parse_cost_model("cost_model", self.cost_model)

    @classmethod
    def env_vars(cls) -> dict[str, str]:
        """Field name -> environment variable."""
        return {f: var for f, (var, _) in cls._ENV.items()}

    @classmethod
    def env_value(cls, field: str, environ: Mapping[str, str] | None = None) -> Any:
        """One field from the environment (its default when the variable is unset), parsed and
        checked like :meth:`from_env`, without reading the other variables (the runtime reads
        ``timeout_s`` this way)."""
        environ = os.environ if environ is None else environ
        var, parse = cls._ENV[field]
        if var in environ:
            return parse(var, environ[var])
        return next(f.default for f in dataclasses.fields(cls) if f.name == field)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> OverlapConfig:
        """Defaults, then ``environ`` (``os.environ`` by default), then ``overrides``."""
        environ = os.environ if environ is None else environ
        _warn_unknown_variables(environ)
        values: dict[str, Any] = {}
        for fname, (var, parse) in cls._ENV.items():
            if var in environ:
                values[fname] = parse(var, environ[var])
        return dataclasses.replace(cls(**values), **_parse_overrides(overrides))

    def rewrite_fields(self) -> dict[str, Any]:
        """Every field but the paths (``PATH_FIELDS``): what a rewritten graph depends on, which every rank must share."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in PATH_FIELDS}

    def replace(self, **overrides: Any) -> OverlapConfig:
        return dataclasses.replace(self, **_parse_overrides(overrides))

    @property
    def passes_named(self) -> bool:
        """Did the user name the passes (``OVERLAP_PASSES`` or ``passes=``)? The default is this
        module's ``DEFAULT_PASS_ORDER`` object itself; a parsed list is always a new tuple, even
        when it lists the same passes (``OVERLAP_PASSES=default`` included). Where they were not
        named, the active cost model may add ``cta_pipeline`` where it predicts a win."""
        return self.passes is not DEFAULT_PASS_ORDER


def known_variables() -> list[str]:
    """The ``OVERLAP_*`` environment variables the backend reads."""
    return [var for var, _ in OverlapConfig._ENV.values()]


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """The ``OVERLAP_*`` names set in ``environ`` that nothing reads (a typo is otherwise silently ignored)."""
    known = set(known_variables())
    return sorted(k for k in environ
                  if k.startswith("OVERLAP_") and k not in known and not k.startswith(OTHER_VARIABLE_PREFIXES))


def _warn_unknown_variables(environ: Mapping[str, str]) -> None:
    for name in unknown_variables(environ):
        if name in _warned_unknown:
            continue
        _warned_unknown.add(name)
        close = difflib.get_close_matches(name, known_variables(), n=1, cutoff=0.8)
        log.warning("%s is set, but overlap_backend reads no such variable%s; it reads: %s", name,
                    f" (did you mean {close[0]}?)" if close else "", ", ".join(known_variables()))


def _parse_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
    fields = {f.name for f in dataclasses.fields(OverlapConfig)}
    parsed: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in fields:
            raise ConfigError(f"unknown option {key!r}; allowed: {', '.join(sorted(fields))}")
        _, parse = OverlapConfig._ENV[key]
        if isinstance(value, bool) and parse is _parse_bool:
            parsed[key] = value
        elif parse is _parse_bool:
            parsed[key] = _parse_bool(key, str(value))
        else:
            parsed[key] = parse(key, value)
    return parsed


__all__ = ["OverlapConfig", "ConfigError", "DEFAULT_PASS_ORDER", "LOWERINGS", "COST_MODEL_MODES", "TIMEOUT_MIN_S",
           "TIMEOUT_MAX_S"]
