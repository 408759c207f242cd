"""GPU tests (marker ``gpu``) of the ``moe_experts`` symm lowering with its expert GEMMs by
``torch._grouped_mm`` (``knobs.moe.EXPERT_GEMM = "grouped_mm"``, ``runtime/moe_grouped.py``) and by the
Triton kernels (``"triton"``), against NCCL all-to-alls + float32 experts.

Run on the device machine (one GPU is enough: ``OVERLAP_TEST_SHARED_GPU=1`` puts both ranks on GPU 0):
``env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA ../tests/gpu/test_gpu_moe_grouped.py``
from bench/.

- eager: separate and fused gate/up weights (``[E, H, 2F]`` gate first, ``F.linear``'s ``[E, 2F, H]`` up
  first), balanced and skewed routing, experts with zero rows, grouped rows pointing nowhere and rows past
  the last expert, bf16 and float32 tokens, both segment layouts (one per source: remote-first phased;
  one of everything: expert-major order); fresh random inputs every call, outputs poisoned; the path
  taken counted (``PATHS``);
- CUDA graphs: a call captured after eager warm-up calls, replayed on new tokens and grouped-row orders.
"""

from __future__ import annotations

import math
import os
import zlib

os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})

import pytest  # noqa: E402
import torch  # noqa: E402

try:
    from dist_harness import run_ranks
    from test_gpu import _need_gpus
    from test_gpu_moe import CASES, _poison, _reference, _rel, _routing
except ImportError:
    from tests.dist_harness import run_ranks
    from tests.gpu.test_gpu import _need_gpus
    from tests.gpu.test_gpu_moe import CASES, _poison, _reference, _rel, _routing

pytestmark = pytest.mark.gpu
GEMMS = pytest.mark.parametrize("gemm", ["grouped_mm", "triton"])
LAYOUTS = ("split", "gate_up", "linear_up_gate")


def _weights(experts, h, f, device, layout):
    """bf16 (w_gate, w_up, w_down) as the op takes them; fused layouts as views of one weight."""
    rnd = lambda *s, fan: (torch.randn(*s, device=device) / math.sqrt(fan)).to(torch.bfloat16)  # noqa: E731
    wd = rnd(experts, f, h, fan=f)
    if layout == "split":
        return rnd(experts, h, f, fan=h), rnd(experts, h, f, fan=h), wd
    if layout == "gate_up":  # [E, H, 2F], gate half first
        w = rnd(experts, h, 2 * f, fan=h)
        return w[..., :f], w[..., f:], wd
    w = rnd(experts, 2 * f, h, fan=h).transpose(1, 2)  # F.linear's [E, 2F, H], up half first
    return w[..., f:], w[..., :f], wd


def _routed(case, ws, rank, experts, gen, device, call):
    counts, experts_of = _routing(case, ws, experts, gen)
    send, recv = counts[rank].tolist(), counts[:, rank].tolist()
    e_of = experts_of[rank].to(device)
    rows = torch.sort(e_of, stable=True).indices
    ends = torch.cumsum(torch.bincount(e_of, minlength=experts), 0)
    if call % 3 == 1 and rows.numel():  # some grouped rows point nowhere
        rows[::7] = -1
    if call % 4 == 2 and rows.numel() > 4:  # rows past the last expert's end
        ends = torch.clamp(ends, max=rows.numel() - 3)
    return send, recv, rows, ends.to(torch.int32)


def eager_worker(rank, ws, device, gemm, calls=6):
    import torch.distributed as dist

    import overlap_backend  # noqa: F401
    from overlap_backend.runtime import symm
    from overlap_backend.runtime.symm import lowering_helpers
    from overlap_backend.spec import knobs

    knobs.codegen.set(AUTOTUNE=False)
    torch.manual_seed(rank)
    torch.backends.cuda.matmul.allow_tf32 = False
    knobs.moe.set(ENABLED=True, COMM_SMS=0, EXPERT_GEMM=gemm)  # no comm kernel: the grouped_mm form's condition
    group = dist.group.WORLD
    errs, bad, total = {}, [], 0
    for case in ("balanced", "skewed", "empty_experts", "decode"):
        _, h, f, experts, _ = CASES[case]
        for layout in LAYOUTS:
            gen = torch.Generator().manual_seed(zlib.crc32(f"{case} {layout}".encode()))  # same on every rank
            for call in range(calls):
                send, recv, rows, ends = _routed(case, ws, rank, experts, gen, device, call)
                wg, wu, wd = _weights(experts, h, f, device, layout)
                x_dtype = torch.float32 if call == calls - 1 else torch.bfloat16
                x = torch.randn(sum(send), h, device=device).to(x_dtype)
                ref = _reference(x, send, recv, rows, ends, wg, wu, wd, group)
                _poison(x.numel() * 16)
                use_offsets = call % 2 == 0
                # both segment layouts: per source (remote-first, phased) and one (expert-major order)
                with knobs.moe.patch(ORDER=("source", "expert")[call % 2], SCHEDULE="phased"):
                    out, _ = torch.ops.overlap.moe_experts(
                        x, send, recv, rows, ends if use_offsets else None,
                        [] if use_offsets else torch.diff(ends, prepend=ends.new_zeros(1)).tolist(),
                        wg, wu, wd, group.group_name, "symm", [False] * 5)
                total += 1
                err = _rel(out.float(), ref.float())
                key = f"{case} {layout}"
                errs[key] = max(errs.get(key, 0.0), err)
                if not err <= 1e-2:
                    bad.append(f"rank {rank} {gemm} {key} call {call} ({x_dtype}): rel err {err:.3e}")
    torch.cuda.synchronize()
    symm.check_status()
    paths = dict(lowering_helpers.PATHS)
    if paths.get(f"moe_experts:symm:{gemm}", 0) != total:
        bad.append(f"rank {rank}: {total} calls, paths {paths}")
    assert not bad, "\n".join(bad[:20])
    return {"errs": errs, "paths": paths}


@GEMMS
@pytest.mark.timeout(600)
def test_moe_expert_gemms_numerics(gemm):
    _need_gpus(2)
    for rank, res in enumerate(run_ranks(eager_worker, 2, "cuda", gemm, timeout=580, backend="nccl")):
        print(f"{gemm} rank {rank}: " + ", ".join(f"{k} {v:.1e}" for k, v in sorted(res["errs"].items()))
              + f" {res['paths']}")


def captured_worker(rank, ws, device, gemm, layout):
    """One call captured in a CUDA graph after eager warm-up calls, replayed 8 times on fresh tokens and
    grouped-row orders (poisoned output), an eager call with other splits between replays."""
    import torch.distributed as dist

    import overlap_backend  # noqa: F401
    from overlap_backend.runtime import symm
    from overlap_backend.runtime.symm import lowering_helpers
    from overlap_backend.spec import knobs

    knobs.codegen.set(AUTOTUNE=False)
    torch.manual_seed(rank)
    torch.backends.cuda.matmul.allow_tf32 = False
    knobs.moe.set(ENABLED=True, COMM_SMS=0, EXPERT_GEMM=gemm)
    knobs.symm.set(CAPTURE_ON_SYMM=True)
    group = dist.group.WORLD
    _, h, f, experts, _ = CASES["skewed"]
    gen = torch.Generator().manual_seed(12)  # the same on every rank
    wg, wu, wd = _weights(experts, h, f, device, layout)
    send, recv, rows, ends = _routed("skewed", ws, rank, experts, gen, device, 0)
    x = torch.randn(sum(send), h, device=device).to(torch.bfloat16)

    def call(x, send, recv, rows, ends):
        return torch.ops.overlap.moe_experts(x, send, recv, rows, ends, [], wg, wu, wd, group.group_name, "symm",
                                             [False] * 5)[0]

    def check(out, x, send, recv, rows, ends, label):
        err = _rel(out.float(), _reference(x, send, recv, rows, ends, wg, wu, wd, group).float())
        assert err <= 1e-2, f"rank {rank} {gemm} {layout} {label}: rel err {err:.3e}"
        return err

    for i in range(2):
        check(call(x, send, recv, rows, ends), x, send, recv, rows, ends, f"eager warm-up {i}")
    torch.cuda.synchronize()
    before = dict(lowering_helpers.PATHS)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = call(x, send, recv, rows, ends)
    went = {k: v - before.get(k, 0) for k, v in lowering_helpers.PATHS.items() if v != before.get(k, 0)}
    assert went == {"moe_experts:symm": 1, f"moe_experts:symm:{gemm}": 1}, f"rank {rank}: captured call went {went}"
    worst = 0.0
    for i in range(8):
        x.copy_(torch.randn(x.shape, device=device).to(torch.bfloat16))
        lo = 0  # a new grouped-row order within each expert: a new plan on the device
        for hi in ends.tolist():
            rows[lo:hi] = rows[lo:hi][torch.randperm(hi - lo, device=device)]
            lo = hi
        static_out.fill_(float("nan"))
        graph.replay()
        worst = max(worst, check(static_out, x, send, recv, rows, ends, f"replay {i}"))
        if i % 3 == 1:
            s2, r2, rows2, ends2 = _routed("balanced", ws, rank, experts, gen, device, 3)
            x2 = torch.randn(sum(s2), h, device=device).to(torch.bfloat16)
            worst = max(worst, check(call(x2, s2, r2, rows2, ends2), x2, s2, r2, rows2, ends2, f"eager after {i}"))
    torch.cuda.synchronize()
    symm.check_status()
    del graph
    return f"{gemm} {layout}: captured {went}; max rel err {worst:.1e}"


@pytest.mark.parametrize("layout", ["split", "gate_up"])
@GEMMS
@pytest.mark.timeout(300)
def test_captured_moe_expert_gemms(gemm, layout):
    _need_gpus(2)
    print(run_ranks(captured_worker, 2, "cuda", gemm, layout, timeout=280, backend="nccl"))
