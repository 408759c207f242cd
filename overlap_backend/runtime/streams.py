"""Side streams of the lowerings, one set per device, created once.

Communication streams get the highest priority so that a transfer's launch is not queued behind a
long GEMM's blocks. Lowerings take distinct slots: ``p2p`` its ring (0), ``symm`` its copy-engine
pushes (1; or one per peer, 16 + peer), its local copy-outs (2) and the
``moe_experts`` communication kernel (3), so that a wait on one never stalls another.
"""

from functools import cache

import torch

P2P_RING, SYMM_PUSH, SYMM_COPY_OUT, SYMM_MOE_COMM = 0, 1, 2, 3
SYMM_PUSH_TO = 16  # + peer rank: symm's pushes to one peer (knobs.symm.PUSH_STREAM_PER_PEER)


@cache
def comm_stream(device_index: int, slot: int) -> torch.cuda.Stream:
    return torch.cuda.Stream(device=device_index, priority=-1)
