"""overlap_backend: a ``torch.compile`` backend that overlaps communication with the computation
that depends on it.

    import overlap_backend
    torch.compile(model, backend="overlap")                      # defaults + OVERLAP_* env vars
    torch.compile(model, backend=overlap_backend.make_backend(passes=["ag_mm"], lowering="p2p"))
"""

from __future__ import annotations

from . import runtime  # noqa: F401  registers torch.ops.overlap.* and the lowerings
from .backend import REPORTS, OverlapBackend, make_backend, overlap, register_torch_logs
from .config import ConfigError, OverlapConfig
from .rank_config import RankConfigMismatchError

__all__ = ["ConfigError", "OverlapBackend", "OverlapConfig", "RankConfigMismatchError", "REPORTS", "make_backend",
           "overlap"]
__version__ = "0.1.0"


def _register() -> None:
    from torch._dynamo.backends import registry

    # When Dynamo found us through the ``torch_dynamo_backends`` entry point it registers the
    # backend itself right after this import; registering here too would be a duplicate.
    if "overlap" not in registry._COMPILER_FNS and registry._BACKENDS.get("overlap") is None:
        registry.register_backend(overlap, name="overlap")


_register()
register_torch_logs()
