"""Run-time side of the backend: the ``torch.ops.overlap`` ops and their lowerings.

Nothing here knows about FX graphs. Importing this package registers the ops and every lowering
that can be imported on this machine.
"""

from . import lowering, ops, p2p, symm_lowering, moe_p2p, moe_symm, cta_p2p, cta_symm  # noqa: F401  (registration side effects)
from .checks import OverlapGroupError, OverlapInputError
from .lowering import LoweringError, available
from .p2p import P2PError

__all__ = ["LoweringError", "OverlapGroupError", "OverlapInputError", "P2PError", "available", "lowering", "ops"]
