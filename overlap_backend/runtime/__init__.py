"""Run-time side of the backend: the ``torch.ops.overlap`` ops and their lowerings.

Nothing here knows about FX graphs. Importing this package registers the ops and every lowering
that can be imported on this machine, and installs the symm groups' process hooks (their buffers
released at exit and when their process group is destroyed).
"""

from . import lowering, ops, p2p, moe_p2p, moe_symm, cta_p2p, cta_symm, symm  # noqa: F401  (registration side effects)
from . import tp_experts, tp_experts_p2p  # noqa: F401  (the tensor-parallel experts' ops and lowerings)
from .checks import OverlapGroupError, OverlapInputError
from .lowering import LoweringError, available
from .p2p import P2PError
from .symm import ag_mm, mm_ar, mm_rs  # noqa: F401  (the symm lowerings of those ops register themselves)

symm.install_process_hooks()

__all__ = ["LoweringError", "OverlapGroupError", "OverlapInputError", "P2PError", "available", "lowering", "ops"]
