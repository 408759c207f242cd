import os
import sys

# Triton decides at import time whether its own library functions (tl.cdiv, ...) run under the
# interpreter, and any test module may import it (through torch._inductor) before the tile-kernel
# tests run: where there is no GPU, turn the interpreter on before anything imports Triton.
if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

import tempfile  # noqa: E402

import pytest  # noqa: E402

# Inductor's caches stay on under the backend: a test run gets caches of its own (ranks inherit them), so
# no graph compiled by an earlier run, or a user's cached calibration or tuned configs, answers for this one
# (the backend's cache root is $XDG_CACHE_HOME/overlap_backend where OVERLAP_CACHE_DIR is unset).
for _var, _kind in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("XDG_CACHE_HOME", "xdg")):
    if _var not in os.environ:
        os.environ[_var] = tempfile.mkdtemp(prefix=f"overlap-tests-{_kind}-")

# Tests import the harness and sibling test modules (shared GPU-test helpers) as plain modules, from
# any folder of tests/; spawned ranks unpickle their workers the same way (spawn copies sys.path).
_TESTS = os.path.dirname(os.path.abspath(__file__))
for _d in [_TESTS] + sorted(e.path for e in os.scandir(_TESTS) if e.is_dir() and not e.name.startswith((".", "_"))):
    if _d not in sys.path:
        sys.path.insert(0, _d)

pytest_plugins = ["ratio_files"]  # the ``ratios`` fixture: a kernel-ratio file of a test's own


@pytest.fixture(autouse=True)
def _gpu_tests_rewrite_every_match(request, monkeypatch):
    """GPU tests check that every match is rewritten and run the ops, at small shapes: they run with
    the cost model off (on CUDA, OVERLAP_COST_MODEL=auto would keep small matches plain), unless the
    environment asks otherwise. Ranks spawned by the test inherit it."""
    if request.node.get_closest_marker("gpu") is not None and "OVERLAP_COST_MODEL" not in os.environ:
        monkeypatch.setenv("OVERLAP_COST_MODEL", "off")


@pytest.fixture
def fake_pg():
    """A one-process fake group of 4 ranks (this process is rank 1): graphs trace and ops run,
    without any communication. Exact-graph tests use it."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch._dynamo.reset()
    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=4)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()
        torch._dynamo.reset()


@pytest.fixture
def clean_env(monkeypatch):
    for var in list(os.environ):
        if var.startswith("OVERLAP_"):
            monkeypatch.delenv(var)
    return monkeypatch


@pytest.fixture
def capture(monkeypatch):
    """Keep each rewritten graph on the backend as ``backend.graphs``."""
    from overlap_backend.backend import OverlapBackend

    orig = OverlapBackend.run_pipeline

    def run_pipeline(self, graph, kind=None):
        report = orig(self, graph, kind)
        self.__dict__.setdefault("graphs", []).append(graph)
        return report

    monkeypatch.setattr(OverlapBackend, "run_pipeline", run_pipeline)
