import os
import sys

import pytest

# Tests import the harness as a plain module; spawned ranks import it the same way.
sys.path.insert(0, os.path.dirname(__file__))


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
