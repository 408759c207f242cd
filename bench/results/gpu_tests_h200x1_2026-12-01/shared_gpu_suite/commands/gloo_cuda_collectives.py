"""Which functional collectives survive CUDA tensors on a gloo group (two ranks on GPU 0)?

    python gloo_cuda_collectives.py      # one pair of processes per collective, so a crash hides nothing
"""
import faulthandler
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.multiprocessing as mp

CASES = {
    "all_reduce": lambda x, g: funcol.all_reduce(x, "sum", g),
    "all_gather_tensor": lambda x, g: funcol.all_gather_tensor(x, 0, g),
    "reduce_scatter_tensor": lambda x, g: funcol.reduce_scatter_tensor(x, "sum", 0, g),
    "all_to_all_single": lambda x, g: funcol.all_to_all_single(x, None, None, g),
}


def rank_main(rank, store_path, case):
    faulthandler.enable(all_threads=True)
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    x = torch.randn(8, 16, device="cuda") + rank
    y = funcol.wait_tensor(CASES[case](x, dist.group.WORLD))
    torch.cuda.synchronize()
    print(f"{case} rank {rank}: ok, {tuple(y.shape)} on {y.device}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    for case in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            ctx = mp.get_context("spawn")
            procs = [ctx.Process(target=rank_main, args=(r, os.path.join(tmp, "s"), case)) for r in range(2)]
            for p in procs:
                p.start()
            for p in procs:
                p.join(60)
                if p.is_alive():
                    p.kill()
            print(f"== {case}: exit codes {[p.exitcode for p in procs]}", flush=True)
    sys.exit(0)
