"""The one root of every on-disk cache of the backend, one folder per kind: ``calibration`` (the cost
model's measurements), ``autotune`` (the tile kernels' tuned block configs, ``codegen/configs.py``),
``kernels`` (generated epilogue sources, ``codegen/epilogue.py``). The kernel caches' keys include
``knobs.knobs_hash()``, so a patched knob never reuses what was tuned or generated under another value."""

from __future__ import annotations

import os
from pathlib import Path

from ..config import OverlapConfig


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir``, else ``OVERLAP_CACHE_DIR``, else ``$XDG_CACHE_HOME/overlap_backend``, else
    ``~/.cache/overlap_backend``."""
    chosen = cache_dir or OverlapConfig.env_value("cache_dir")
    if chosen:
        return Path(chosen)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "overlap_backend"


def cache_path(kind: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """The folder of one cache (``kind``: ``calibration``, ``autotune``, ``kernels``) under :func:`cache_root`."""
    return cache_root(cache_dir) / kind
