"""GPU tests (marker ``gpu``) of the cuBLAS forms of the CTA-pipeline stages (``runtime/cta_cublas.py``).

``knobs.cta.STAGE0_GEMM`` / ``STAGE1_GEMM`` forced to each of the four combinations of "triton" and
"cublas", for GELU (tanh; the last row group's stage-0 tails, a fill share) and SwiGLU (its share),
M = 16, 512, 1024 (1024 rows at N=8192: two row groups at tp=1), bf16 with biases. Each case: fresh
random inputs, the symmetric buffer poisoned with NaN first, the result against the float32 MLP
all-reduced, every rank the same bits, the path counters of the rank's stage; then the same call
captured in a CUDA graph and replayed on fresh inputs (output poisoned before each replay), an eager
call between replays.

Ranks sharing one GPU: ``OVERLAP_TEST_SHARED_GPU=1`` (gloo), as ``test_gpu_cta.py``.
"""

from __future__ import annotations

import os

os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})

import pytest  # noqa: E402
import torch  # noqa: E402

try:
    from test_gpu import _need_gpus, _rel_err, _run, _setup_rank
    from test_gpu_cta import _poison, _reference, _same_on_every_rank, _shards
except ImportError:  # imported as tests.gpu.test_gpu_cta_cublas
    from tests.gpu.test_gpu import _need_gpus, _rel_err, _run, _setup_rank
    from tests.gpu.test_gpu_cta import _poison, _reference, _same_on_every_rank, _shards

pytestmark = pytest.mark.gpu

H, F, N = 1024, 8192, 8192
FORMS = [(s0, s1) for s0 in ("triton", "cublas") for s1 in ("triton", "cublas")]
ACTS = [("gelu", "tanh"), ("swiglu", "none")]
SIZES = (16, 512, 1024)


def cublas_worker(rank: int, ws: int, device: str):
    import torch.distributed as dist

    _setup_rank(rank, device)
    from overlap_backend.runtime import cta_plan, symm
    from overlap_backend.runtime.symm import lowering_helpers
    from overlap_backend.spec import knobs

    group = dist.group.WORLD
    op = torch.ops.overlap.cta_pipeline_mlp
    dev = torch.device(device, torch.cuda.current_device())
    stage = rank // (ws // 2)
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    bad, report = [], []
    paths = lowering_helpers.PATHS

    def fresh_x(M):
        x = torch.randn(M, H, device=device).to(torch.bfloat16)
        dist.broadcast(x, src=0)
        return x

    for act, approximate in ACTS:
        weights = _shards(ws, 1, H, F, N, act, True, torch.bfloat16, device)[1:]

        def call(x):
            return op(x, *weights, act, approximate, 2, group.group_name, "symm")

        def check(out, x, label):
            err = _rel_err(out, _reference((x, *weights), act, approximate, group))
            report.append(f"{label}: rel err {err:.2e}")
            if not err <= 1e-2:
                bad.append(f"rank {rank}: {label}: rel err {err:.3e}")

        for M in SIZES:
            plan = cta_plan.chunk_plan(M, F, N, ws // 2, act == "swiglu", torch.bfloat16, num_sms, H=H)
            for s0, s1 in FORMS:
                label = f"{act} M={M} stage0={s0} stage1={s1} (groups {plan.groups}, f1 {plan.f1}, tail {plan.tail})"
                counter = f"cta_pipeline_mlp:symm:stage{stage}_{(s0, s1)[stage]}"
                with knobs.cta.patch(STAGE0_GEMM=s0, STAGE1_GEMM=s1):
                    call(fresh_x(M))  # buffers, placement, kernels
                    _poison(group.group_name, dev)
                    x, before = fresh_x(M), paths[counter]
                    out = call(x)
                    check(out, x, f"eager {label}")
                    if paths[counter] != before + 1:
                        bad.append(f"rank {rank}: {label}: {counter} not counted ({dict(paths)})")
                    if not _same_on_every_rank(out, group):
                        bad.append(f"rank {rank}: eager {label}: the ranks' results differ")

                    x = fresh_x(M)
                    torch.cuda.synchronize()
                    side = torch.cuda.Stream()
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        call(x)
                    torch.cuda.current_stream().wait_stream(side)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        out = call(x)
                    for i in range(4):
                        x.copy_(fresh_x(M))
                        if i == 2:  # eager calls and replays keep separate epochs
                            check(call(x), x, f"eager between replays {label}")
                        out.fill_(float("nan"))
                        graph.replay()
                        check(out, x, f"replay {i} {label}")
                    if not _same_on_every_rank(out, group):
                        bad.append(f"rank {rank}: replayed {label}: the ranks' results differ")
                    torch.cuda.synchronize()
                    symm.check_status()
                    del graph
    torch.cuda.synchronize()
    symm.check_status()
    assert not bad, "\n".join(bad)
    return report


@pytest.mark.parametrize("ws", [2, 4], ids=["ws2", "ws4"])
@pytest.mark.timeout(600)
def test_cta_cublas_stages(ws):
    _need_gpus(ws)
    for rank, report in enumerate(_run(cublas_worker, ws, timeout=580)):
        if rank == 0:
            print(f"ws={ws}:\n  " + "\n  ".join(report))
