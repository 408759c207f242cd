"""Run-time side of the backend: the ``torch.ops.overlap`` ops and their lowerings.

Nothing here knows about FX graphs. Importing this package registers the ops and every lowering
that can be imported on this machine.
"""

from . import lowering, ops, p2p, symm_lowering, moe_p2p, moe_symm, cta_p2p, cta_symm  # noqa: F401  (registration side effects)
from .lowering import LoweringError, available

__all__ = ["LoweringError", "available", "lowering", "ops"]
