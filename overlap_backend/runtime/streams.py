"""Side streams of the lowerings, one set per device, created once.

Communication streams get the highest priority so that a transfer's launch is not queued behind a
long GEMM's blocks. Lowerings take distinct slots: ``p2p`` its ring (0), ``symm`` its copy-engine
pushes (1), its local copy-outs (2) and the
``moe_experts`` communication kernel (3), so that a wait on one never stalls another.
"""

from functools import cache

import torch

P2P_RING, SYMM_PUSH, SYMM_COPY_OUT, SYMM_MOE_COMM = 0, 1, 2, 3


@cache
def comm_stream(device_index: int, slot: int) -> torch.cuda.Stream:
    return torch.cuda.Stream(device=device_index, priority=-1)
