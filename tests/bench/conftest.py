"""Fixtures of the bench tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "bench" / "tools"


@pytest.fixture
def bench_tool():
    """Loads ``bench/tools/<name>.py`` as a module (the scripts are run by path, not imported as a package)."""

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load
