"""GPU tests (marker ``gpu``): the ``p2p`` lowering of the overlap ops on 2, 4 and 8 GPUs with NCCL.

Run on the device machine with ``python -m pytest -q -m gpu tests/gpu/test_gpu.py`` (bench/run_device.sh
does); where fewer GPUs are visible every test skips. Each test spawns one process per GPU through
``dist_harness.run_ranks(..., backend="nccl")``, so every worker is a module-level function; the
workers take the device type so that the same code can be exercised on gloo/CPU.

What is checked, for world sizes 2, 4 and 8 (every size here is valid for any world size: the
rows that are split are given per rank or as ``ws *`` a count; at ws=8 ``mm_ar`` on 2100 rows has a
last chunk shorter than the others, 2100 = 7 x 263 + 259, which 2 and 4 ranks never see):

- numerics of ``ag_mm`` / ``mm_rs`` / ``mm_ar`` (lowering ``p2p``) against the NCCL collective and a
  float32 matmul on fresh random data, in bf16, fp16 and fp32: sizes that are not multiples of 128,
  3-D inputs gathered/scattered along dim 1, gathers along the last (contraction) dim, biases,
  several weights, ``avg``; relative error <= 1e-2 (bf16, fp16) / 1e-4 (fp32), NaN never passes;
- 100 back-to-back calls of each op with the same inputs give bit-identical results, and 20
  back-to-back calls on different inputs each give their own right answer (no stale buffers);
- two process groups at once: a subgroup (pairs of ranks on 4 and 8 GPUs, a second communicator over
  the same ranks on 2) on a side stream interleaved with the world group on the default stream;
- a compiled tensor-parallel block (all-gather -> two matmuls -> gelu -> matmul -> reduce-scatter) and
  a row-parallel MLP (matmul -> all-reduce) through ``make_backend(lowering="p2p")`` with Inductor,
  forward and backward against eager (bf16, 1e-2), with the backend's reports showing the rewrites.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time

# NVLink multicast stays off on the GPU machines; spawned ranks inherit this environment.
os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})

import pytest  # noqa: E402
import torch  # noqa: E402

try:
    from dist_harness import on_group_device, run_ranks, shared_gpu
except ImportError:  # imported as tests.gpu.test_gpu
    from tests.dist_harness import on_group_device, run_ranks, shared_gpu

pytestmark = pytest.mark.gpu

WORLD_SIZES = pytest.mark.parametrize("ws", [2, 4, 8], ids=["ws2", "ws4", "ws8"])
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _tol(dtype: torch.dtype) -> float:
    return 1e-4 if dtype in (torch.float32, torch.float64) else 1e-2


def _need_gpus(ws: int, lowering: str = "symm", eager_all_gather: bool = False) -> None:
    """Skip unless ``ws`` GPUs (one under ``OVERLAP_TEST_SHARED_GPU``) and NCCL are here.

    ``eager_all_gather``: the test runs models whose eager forward all-gathers CUDA tensors over the
    group (the references, and collectives left unmatched in the compiled graphs); under
    ``OVERLAP_TEST_SHARED_GPU`` that is gloo's all_gather_into_tensor, which segfaults on CUDA tensors
    with torch 2.11 (all_reduce, reduce_scatter and all_to_all work)."""
    if shared_gpu() and lowering == "p2p":
        pytest.skip("OVERLAP_TEST_SHARED_GPU runs gloo, which cannot send CUDA tensors point to point")
    if shared_gpu() and eager_all_gather:
        pytest.skip("OVERLAP_TEST_SHARED_GPU runs gloo, whose all_gather_into_tensor segfaults on CUDA tensors")
    need = 1 if shared_gpu() else ws  # OVERLAP_TEST_SHARED_GPU: every rank on GPU 0 (gloo)
    if not torch.cuda.is_available() or torch.cuda.device_count() < need:
        pytest.skip(f"needs {need} CUDA GPUs, found {torch.cuda.device_count() if torch.cuda.is_available() else 0}")
    import torch.distributed as dist

    if not shared_gpu() and not dist.is_nccl_available():
        pytest.skip("torch was built without NCCL")


def _run(fn, ws: int, *args, timeout: float = 150, env: dict | None = None):
    return run_ranks(fn, ws, "cuda", *args, timeout=timeout, env=env, backend="nccl")


# ============================================================================ helpers (in ranks)
def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if tuple(out.shape) != tuple(ref.shape):
        return math.inf
    out64, ref64 = out.detach().double(), ref.detach().double()
    if not torch.isfinite(out64).all():
        return math.inf
    den = ref64.norm().item()
    return (out64 - ref64).norm().item() / (den if den > 0 else 1.0)


def _randn(*shape, dtype, device, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, device=device) * scale).to(dtype)


def _gather_ref(shard: torch.Tensor, dim: int, group) -> torch.Tensor:
    """all_gather along ``dim`` through the group's collective (exact: a copy)."""
    import torch.distributed as dist

    ws = group.size()
    part = on_group_device(shard.contiguous(), group)
    flat = part.new_empty((ws * shard.shape[0], *shard.shape[1:]))
    dist.all_gather_into_tensor(flat, part, group=group)
    return torch.cat(flat.to(shard.device).chunk(ws, 0), dim=dim)


def _all_reduce_ref(t: torch.Tensor, group) -> torch.Tensor:
    import torch.distributed as dist

    out = on_group_device(t, group).clone()
    dist.all_reduce(out, group=group)
    return out.to(t.device)


def _stream(device: str, stream):
    return torch.cuda.stream(stream) if device == "cuda" else contextlib.nullcontext()


def _group_state(group, device: str):
    """The symm state of ``group`` on this rank's GPU (set up by an earlier eager call)."""
    from overlap_backend.runtime import symm

    return symm.state(group.group_name, torch.device(device, torch.cuda.current_device()))


def _setup_rank(rank: int, device: str) -> None:
    import warnings

    # dist.all_gather_into_tensor and funcol's *_tensor_autograd are used on purpose (they exist on
    # every torch this runs on); their deprecation notices are noise.
    warnings.filterwarnings("ignore", category=FutureWarning)
    torch.manual_seed(1000 + rank)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 references and fp32 cases stay fp32
        torch.backends.cudnn.allow_tf32 = False
    import overlap_backend  # noqa: F401  registers torch.ops.overlap.*
    from overlap_backend.spec import knobs

    knobs.codegen.set(AUTOTUNE=False)  # numerics do not depend on the block config; one compile per variant


# ---- one case per op: run ours, build the reference, return the relative error (and a label)
def _case_ag_mm(group, dtype, device, lowering, lead, k, ns, dim, with_bias, return_gathered=True):
    ws = group.size()
    shard = _randn(*lead, k, dtype=dtype, device=device)
    d = dim % shard.dim()  # the op takes negative dims as they come
    K = k * ws if d == shard.dim() - 1 else k
    weights = [_randn(K, n, dtype=dtype, device=device, scale=K**-0.5) for n in ns]
    biases = [_randn(n, dtype=dtype, device=device) if with_bias and i == 0 else None for i, n in enumerate(ns)]
    gathered, outs = torch.ops.overlap.ag_mm(shard, weights, biases, dim, group.group_name, lowering, return_gathered)
    G = _gather_ref(shard, d, group)
    errs = []
    if return_gathered and not torch.equal(gathered, G):
        errs.append(math.inf)
    if len(outs) != len(weights):
        return math.inf
    G2 = G.float().reshape(-1, G.shape[-1])
    for w, b, out in zip(weights, biases, outs):
        ref = G2 @ w.float() + (b.float() if b is not None else 0)
        errs.append(_rel_err(out, ref))
    return max(errs)


def _case_mm_rs(group, dtype, device, lowering, lead, k, n, dim, with_bias, reduce_op="sum"):
    ws, r = group.size(), group.rank()
    out_shape = [*lead, n]
    m = math.prod(lead)
    a = _randn(m, k, dtype=dtype, device=device)
    b = _randn(k, n, dtype=dtype, device=device, scale=k**-0.5)
    bias = _randn(n, dtype=dtype, device=device) if with_bias else None
    out = torch.ops.overlap.mm_rs(a, b, bias, out_shape, dim, reduce_op, group.group_name, lowering)
    c = a.float() @ b.float() + (bias.float() if bias is not None else 0)
    full = _all_reduce_ref(c.view(out_shape), group)
    if reduce_op == "avg":
        full = full / ws
    ref = full.chunk(ws, dim=dim % len(out_shape))[r]
    return _rel_err(out, ref)


def _case_mm_ar(group, dtype, device, lowering, m, k, n, with_bias, reduce_op="sum"):
    a = _randn(m, k, dtype=dtype, device=device)
    b = _randn(k, n, dtype=dtype, device=device, scale=k**-0.5)
    bias = _randn(n, dtype=dtype, device=device) if with_bias else None
    out = torch.ops.overlap.mm_ar(a, b, bias, reduce_op, group.group_name, lowering)
    ref = _all_reduce_ref(a.float() @ b.float() + (bias.float() if bias is not None else 0), group)
    if reduce_op == "avg":
        ref = ref / group.size()
    return _rel_err(out, ref)


def _cases(ws: int, lowering: str = "p2p"):
    """(label, case function, kwargs): sizes deliberately not multiples of 128."""
    if lowering == "symm":
        return _symm_cases(ws)
    return [
        ("ag_mm 2-D dim0, 2 weights, bias", _case_ag_mm, dict(lead=(37,), k=100, ns=(130, 70), dim=0, with_bias=True)),
        ("ag_mm 3-D dim1", _case_ag_mm, dict(lead=(3, 11), k=96, ns=(50,), dim=1, with_bias=False)),
        ("ag_mm gather last dim, bias", _case_ag_mm, dict(lead=(45,), k=36, ns=(66,), dim=-1, with_bias=True)),
        ("ag_mm 3-D dim0, no gathered", _case_ag_mm,
         dict(lead=(5, 7), k=40, ns=(24, 24, 8), dim=0, with_bias=False, return_gathered=False)),
        ("mm_rs 2-D dim0, bias", _case_mm_rs, dict(lead=(ws * 45,), k=77, n=130, dim=0, with_bias=True)),
        ("mm_rs 3-D dim1", _case_mm_rs, dict(lead=(3, ws * 7), k=50, n=90, dim=1, with_bias=False)),
        ("mm_rs scatter last dim, bias", _case_mm_rs, dict(lead=(33,), k=40, n=ws * 30, dim=-1, with_bias=True)),
        ("mm_rs 3-D dim0 avg", _case_mm_rs, dict(lead=(ws * 5, 3), k=24, n=20, dim=0, with_bias=False, reduce_op="avg")),
        ("mm_ar rows not divisible, bias", _case_mm_ar, dict(m=91, k=66, n=150, with_bias=True)),
        ("mm_ar fewer rows than ranks", _case_mm_ar, dict(m=3, k=20, n=17, with_bias=False)),
        ("mm_ar aligned", _case_mm_ar, dict(m=256, k=128, n=192, with_bias=False)),
    ]


def _symm_cases(ws: int):
    """Cases the symm kernels take (rows of 16-byte multiples; tiles not filled), plus a few that
    fall back to p2p. ``symm`` counts the cases that must run on the kernels."""
    return [
        ("ag_mm 2-D dim0, 2 weights, bias", _case_ag_mm, dict(lead=(37,), k=136, ns=(200, 72), dim=0, with_bias=True)),
        ("ag_mm 3-D dim1", _case_ag_mm, dict(lead=(3, 11), k=96, ns=(56,), dim=1, with_bias=False)),
        ("ag_mm one row per rank, no gathered", _case_ag_mm,
         dict(lead=(1,), k=64, ns=(24,), dim=0, with_bias=False, return_gathered=False)),
        ("ag_mm 512 rows, K 1024", _case_ag_mm, dict(lead=(512,), k=1024, ns=(384,), dim=0, with_bias=True)),
        ("mm_rs 2-D dim0, bias", _case_mm_rs, dict(lead=(ws * 45,), k=72, n=136, dim=0, with_bias=True)),
        ("mm_rs 3-D dim1, runs of 64", _case_mm_rs, dict(lead=(2, ws * 64), k=56, n=96, dim=1, with_bias=False)),
        ("mm_rs avg, 1000 rows per rank, K 2048 (cuBLAS, addmm at ws 2)", _case_mm_rs,
         dict(lead=(ws * 1000,), k=2048, n=264, dim=0, with_bias=False, reduce_op="avg")),
        ("mm_rs 3-D dim1, runs of 256, K 2048 (cuBLAS, a GEMM per run)", _case_mm_rs,
         dict(lead=(3, ws * 256), k=2048, n=200, dim=1, with_bias=False)),
        ("mm_rs 2-D, bias, K 2048 (cuBLAS, summed)", _case_mm_rs,
         dict(lead=(ws * 600,), k=2048, n=136, dim=0, with_bias=True)),
        ("mm_rs 2-D, bias, 512 rows per rank (the kernel's TMA variant applies)", _case_mm_rs,
         dict(lead=(ws * 512,), k=1024, n=384, dim=0, with_bias=True)),
        ("mm_ar one-shot, bias", _case_mm_ar, dict(m=91, k=64, n=152, with_bias=True)),
        ("mm_ar one-shot, fewer rows than ranks", _case_mm_ar, dict(m=3, k=24, n=16, with_bias=False)),
        ("mm_ar rounds, rows not divisible, bias", _case_mm_ar, dict(m=2100, k=136, n=1032, with_bias=True)),
        ("mm_ar rounds avg", _case_mm_ar, dict(m=ws * 1024, k=64, n=1024, with_bias=False, reduce_op="avg")),
        ("mm_ar, K 2048, bias (cuBLAS at ws 2, summed)", _case_mm_ar, dict(m=1500, k=2048, n=1504, with_bias=True)),
        ("mm_ar avg, K 2048 (cuBLAS at ws 2, addmm)", _case_mm_ar,
         dict(m=1536, k=2048, n=2048, with_bias=False, reduce_op="avg")),
        # fall back to p2p: contraction-dim gather, unaligned K, runs of 7 rows
        ("fallback: ag_mm gather last dim", _case_ag_mm, dict(lead=(45,), k=40, ns=(64,), dim=-1, with_bias=True)),
        ("fallback: mm_rs unaligned K", _case_mm_rs, dict(lead=(ws * 9,), k=77, n=64, dim=0, with_bias=False)),
        ("fallback: mm_rs runs of 7", _case_mm_rs, dict(lead=(3, ws * 7), k=48, n=40, dim=1, with_bias=False)),
    ]


SYMM_CASES_ON_KERNELS = 16  # the first 16 of _symm_cases


def _use_lowering(lowering: str) -> str:
    """The op's lowering argument for a test's lowering id; ``symm-peer`` is ``symm`` with the
    reduce-scatter partials shipped by peer stores from the kernel instead of the copy engine,
    ``symm-kernel`` ``symm`` with mm_rs on the Triton producer kernel instead of cuBLAS,
    ``symm-agcublas`` ``symm`` with ag_mm on cuBLAS per chunk instead of the consumer kernel,
    ``symm-rstma`` ``symm`` with mm_rs on the producer kernel's TMA variant where it applies,
    ``symm-artma`` ``symm`` with mm_ar on its rounds kernel's TMA variant where it applies,
    ``symm-perpeer`` ``symm`` with the pushes to each peer on a stream of their own,
    ``symm-arcopy`` ``symm`` with mm_ar's rounds kernel copying the peers' reduced bands into its
    output itself (copy tiles) instead of the host's copies."""
    from overlap_backend.spec import knobs

    # every ag_mm without a generated epilogue on its cuBLAS path with symm-agcublas
    agcublas = {"AG_MM_GEMM": "cublas", "AG_CUBLAS_MIN_N": 0} if lowering == "symm-agcublas" else {}
    knobs.symm.set(PUSH_STREAM_PER_PEER=lowering == "symm-perpeer",
                   TRANSPORT="peer" if lowering == "symm-peer" else "ce",
                   MM_RS_GEMM="triton" if lowering in ("symm-kernel", "symm-rstma", "symm-artma") else "cublas",
                   RS_TMA="only" if lowering == "symm-rstma" else "off",
                   AR_TMA="only" if lowering == "symm-artma" else "off",
                   AR_KERNEL_COPY_OUT=lowering == "symm-arcopy",
                   **agcublas)
    return "symm" if lowering.startswith("symm") else lowering


def _paths() -> dict:
    from overlap_backend.runtime.symm import lowering_helpers

    return dict(lowering_helpers.PATHS)


# ============================================================================ workers
def numerics_worker(rank: int, ws: int, device: str, lowering: str = "p2p"):
    import torch.distributed as dist

    _setup_rank(rank, device)
    lowering_id, lowering = lowering, _use_lowering(lowering)
    group = dist.group.WORLD
    results, bad = [], []
    for dtype in DTYPES:
        for label, case, kwargs in _cases(ws, lowering):
            if shared_gpu() and label.startswith("fallback"):
                continue  # p2p on gloo cannot send CUDA tensors (OVERLAP_TEST_SHARED_GPU runs gloo)
            before = _paths()
            err = case(group, dtype, device, lowering, **kwargs)
            after = _paths()
            took = sorted(k for k in after if after[k] != before.get(k, 0))
            label = f"{label} [{','.join(took) or lowering}]"
            if lowering == "symm" and not label.startswith("fallback") and not any(":symm" in k for k in took):
                bad.append(f"rank {rank}: {label} {dtype}: did not run on the symm kernels ({took})")
            results.append((label, str(dtype), err))
            if not err <= _tol(dtype):
                bad.append(f"rank {rank}: {label} {dtype}: rel err {err:.3e} > {_tol(dtype):g}")
    if lowering_id == "symm-agcublas" and not _paths().get("ag_mm:symm:cublas"):
        bad.append(f"rank {rank}: no ag_mm ran on its cuBLAS path: {_paths()}")
    if lowering_id == "symm-rstma" and not _paths().get("mm_rs:symm:triton-tma"):
        bad.append(f"rank {rank}: no mm_rs ran on the kernel's TMA variant: {_paths()}")
    if lowering_id == "symm-artma" and not _paths().get("mm_ar:symm:triton-tma"):
        bad.append(f"rank {rank}: no mm_ar ran on the rounds kernel's TMA variant: {_paths()}")
    assert not bad, "\n".join(bad)
    return results


def repeat_worker(rank: int, ws: int, device: str, lowering: str = "p2p", calls: int = 100, distinct: int = 20):
    import torch.distributed as dist

    _setup_rank(rank, device)
    lowering_id, lowering = lowering, _use_lowering(lowering)
    group = dist.group.WORLD
    gn = group.group_name
    dtype = torch.bfloat16
    tol = _tol(dtype)
    shard = _randn(40, 96, dtype=dtype, device=device)
    w = _randn(96, 136, dtype=dtype, device=device, scale=96**-0.5)
    a_rs = _randn(ws * 24, 72, dtype=dtype, device=device)
    b_rs = _randn(72, 104, dtype=dtype, device=device, scale=72**-0.5)
    a_ar = _randn(50, 64, dtype=dtype, device=device)
    b_ar = _randn(64, 96, dtype=dtype, device=device, scale=64**-0.5)
    a_rs2 = _randn(ws * 600, 2048, dtype=dtype, device=device)  # symm: mm_rs on cuBLAS
    b_rs2 = _randn(2048, 104, dtype=dtype, device=device, scale=2048**-0.5)
    a_ar2 = _randn(2100, 64, dtype=dtype, device=device)  # symm: rounds, not one-shot
    a_ar3 = _randn(1536, 2048, dtype=dtype, device=device)  # symm: on cuBLAS at ws 2
    b_ar3 = _randn(2048, 1504, dtype=dtype, device=device, scale=2048**-0.5)
    b_ar2 = _randn(64, 1024, dtype=dtype, device=device, scale=64**-0.5)
    a_rs3 = _randn(ws * 512, 1024, dtype=dtype, device=device)  # symm: the kernel, whole tiles (its TMA variant applies)
    b_rs3 = _randn(1024, 128, dtype=dtype, device=device, scale=1024**-0.5)
    low = lowering
    ops = {
        "ag_mm": lambda s: torch.ops.overlap.ag_mm(s, [w], [None], 0, gn, low, False)[1][0],
        "mm_rs": lambda a: torch.ops.overlap.mm_rs(a, b_rs, None, [a.shape[0], 104], 0, "sum", gn, low),
        "mm_rs_cublas": lambda a: torch.ops.overlap.mm_rs(a, b_rs2, None, [a.shape[0], 104], 0, "sum", gn, low),
        "mm_rs_tiles": lambda a: torch.ops.overlap.mm_rs(a, b_rs3, None, [a.shape[0], 128], 0, "sum", gn, low),
        "mm_ar": lambda a: torch.ops.overlap.mm_ar(a, b_ar, None, "sum", gn, low),
        "mm_ar_rounds": lambda a: torch.ops.overlap.mm_ar(a, b_ar2, None, "sum", gn, low),
        "mm_ar_cublas": lambda a: torch.ops.overlap.mm_ar(a, b_ar3, None, "sum", gn, low),
    }

    def ref(name, x):
        if name == "ag_mm":
            return _gather_ref(x, 0, group).float() @ w.float()
        if name == "mm_rs":
            return _all_reduce_ref(x.float() @ b_rs.float(), group).chunk(ws)[rank]
        if name == "mm_rs_cublas":
            return _all_reduce_ref(x.float() @ b_rs2.float(), group).chunk(ws)[rank]
        if name == "mm_rs_tiles":
            return _all_reduce_ref(x.float() @ b_rs3.float(), group).chunk(ws)[rank]
        if name == "mm_ar_rounds":
            return _all_reduce_ref(x.float() @ b_ar2.float(), group)
        if name == "mm_ar_cublas":
            return _all_reduce_ref(x.float() @ b_ar3.float(), group)
        return _all_reduce_ref(x.float() @ b_ar.float(), group)

    bad, summary = [], {}
    for name, x in (("ag_mm", shard), ("mm_rs", a_rs), ("mm_rs_cublas", a_rs2), ("mm_rs_tiles", a_rs3), ("mm_ar", a_ar),
                    ("mm_ar_rounds", a_ar2), ("mm_ar_cublas", a_ar3)):
        op = ops[name]
        # Same inputs, back to back with no host synchronisation: bit-identical results.
        outs = [op(x) for _ in range(calls)]
        differ = [i for i, o in enumerate(outs) if not torch.equal(o, outs[0])]
        err0 = _rel_err(outs[0], ref(name, x))
        if differ:
            bad.append(f"rank {rank}: {name}: calls {differ[:10]} differ from call 0 (of {calls})")
        if not err0 <= tol:
            bad.append(f"rank {rank}: {name}: rel err {err0:.3e}")
        # Different inputs, back to back: each result matches its own inputs.
        xs = [torch.randn_like(x, dtype=torch.float32).to(dtype) for _ in range(distinct)]
        outs = [op(xi) for xi in xs]
        errs = [_rel_err(o, ref(name, xi)) for o, xi in zip(outs, xs)]
        if not max(errs) <= tol:
            bad.append(f"rank {rank}: {name}: distinct inputs, rel errs {[f'{e:.1e}' for e in errs]}")
        summary[name] = (len(differ), err0, max(errs))
    summary["paths"] = _paths()
    if lowering == "symm" and not all(summary["paths"].get(f"{op}:symm", 0) for op in ("ag_mm", "mm_rs", "mm_ar")):
        bad.append(f"rank {rank}: not every op ran on the symm kernels: {summary['paths']}")
    if lowering_id == "symm-rstma" and not summary["paths"].get("mm_rs:symm:triton-tma"):
        bad.append(f"rank {rank}: no mm_rs call took the kernel's TMA variant: {summary['paths']}")
    if lowering_id == "symm-artma" and not summary["paths"].get("mm_ar:symm:triton-tma"):
        bad.append(f"rank {rank}: no mm_ar call took the rounds kernel's TMA variant: {summary['paths']}")
    assert not bad, "\n".join(bad)
    return summary


def two_groups_worker(rank: int, ws: int, device: str, lowering: str = "p2p", iters: int = 10):
    import torch.distributed as dist

    _setup_rank(rank, device)
    world = dist.group.WORLD
    if ws >= 4 and ws % 2 == 0:
        pairs = [dist.new_group([i, i + 1]) for i in range(0, ws, 2)]  # every rank creates every group
        sub = pairs[rank // 2]
    else:
        sub = dist.new_group(list(range(ws)))  # a second communicator over the same ranks
    dtype = torch.bfloat16
    side = torch.cuda.Stream() if device == "cuda" else None
    sws = sub.size()

    shard = _randn(33, 80, dtype=dtype, device=device)
    w = _randn(80, 120, dtype=dtype, device=device, scale=80**-0.5)
    a_rs = _randn(ws * 19, 56, dtype=dtype, device=device)
    b_rs = _randn(56, 72, dtype=dtype, device=device, scale=56**-0.5)
    a_ar = _randn(61, 48, dtype=dtype, device=device)
    b_ar = _randn(48, 88, dtype=dtype, device=device, scale=48**-0.5)
    if side is not None:
        side.wait_stream(torch.cuda.current_stream())

    sub_ag, world_rs, sub_ar, world_ag = [], [], [], []
    for _ in range(iters):
        with _stream(device, side):
            sub_ag.append(torch.ops.overlap.ag_mm(shard, [w], [None], 0, sub.group_name, lowering, False)[1][0])
        world_rs.append(torch.ops.overlap.mm_rs(a_rs, b_rs, None, [ws * 19, 72], 0, "sum", world.group_name, lowering))
        with _stream(device, side):
            sub_ar.append(torch.ops.overlap.mm_ar(a_ar, b_ar, None, "sum", sub.group_name, lowering))
        world_ag.append(torch.ops.overlap.ag_mm(shard, [w], [None], 0, world.group_name, lowering, False)[1][0])
    if side is not None:
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()

    refs = {
        "sub ag_mm": (_gather_ref(shard, 0, sub).float() @ w.float(), sub_ag),
        "world mm_rs": (_all_reduce_ref(a_rs.float() @ b_rs.float(), world).chunk(ws)[rank], world_rs),
        "sub mm_ar": (_all_reduce_ref(a_ar.float() @ b_ar.float(), sub), sub_ar),
        "world ag_mm": (_gather_ref(shard, 0, world).float() @ w.float(), world_ag),
    }
    bad, summary = [], {}
    for name, (ref, outs) in refs.items():
        errs = [_rel_err(o, ref) for o in outs]
        summary[name] = max(errs)
        if not max(errs) <= _tol(dtype):
            bad.append(f"rank {rank}: {name} (subgroup size {sws}): rel errs {[f'{e:.1e}' for e in errs]}")
    summary["paths"] = _paths()
    assert not bad, "\n".join(bad)
    return summary


# ---- the compiled models (written with funcol, as a user would)
class _AllReduceSum(torch.autograd.Function):
    """funcol all-reduce whose backward is the identity (Megatron's row-parallel convention);
    written out so that eager and compiled agree on every torch version."""

    @staticmethod
    def forward(ctx, x, group_name):
        import torch.distributed._functional_collectives as funcol

        return funcol.wait_tensor(funcol.all_reduce(x, "sum", group_name))

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class TPBlock(torch.nn.Module):
    """Sequence-parallel block: all-gather(seq) -> x@Wq, x@Wk -> gelu(q)*k -> @Wo -> reduce-scatter(seq)."""

    def __init__(self, hidden: int, ffn: int, group_name: str, dtype, device):
        super().__init__()
        self.group_name = group_name

        def p(*shape, fan_in):
            return torch.nn.Parameter(_randn(*shape, dtype=dtype, device=device, scale=fan_in**-0.5))

        self.wq = p(hidden, ffn, fan_in=hidden)
        self.wk = p(hidden, ffn, fan_in=hidden)
        self.wo = p(ffn, hidden, fan_in=ffn)

    def forward(self, x):  # x: [batch, seq / ws, hidden]
        import torch.distributed._functional_collectives as funcol

        g = funcol.all_gather_tensor_autograd(x, 1, self.group_name)
        h = torch.nn.functional.gelu(g @ self.wq) * (g @ self.wk)
        return funcol.reduce_scatter_tensor_autograd(h @ self.wo, "sum", 1, self.group_name)


class RowParallelMLP(torch.nn.Module):
    """Inference-TP MLP: gelu(x @ W1) @ W2 -> all-reduce; x replicated, W1/W2 sharded."""

    def __init__(self, hidden: int, ffn: int, group_name: str, dtype, device):
        super().__init__()
        self.group_name = group_name
        self.w1 = torch.nn.Parameter(_randn(hidden, ffn, dtype=dtype, device=device, scale=hidden**-0.5))
        self.w2 = torch.nn.Parameter(_randn(ffn, hidden, dtype=dtype, device=device, scale=ffn**-0.5))

    def forward(self, x):  # x: [tokens, hidden]
        return _AllReduceSum.apply(torch.nn.functional.gelu(x @ self.w1) @ self.w2, self.group_name)


def _compare_fwd_bwd(eager, compiled, make_input, dtype, steps: int = 2, before_step=None) -> dict[str, float]:
    """Max relative error per tensor (output, input grad, parameter grads) over ``steps`` steps
    (``before_step``: called at the start of each)."""
    errs: dict[str, float] = {}
    for _ in range(steps):
        if before_step is not None:
            before_step()
        x = make_input()
        xe, xc = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        ye, yc = eager(xe), compiled(xc)
        dy = torch.randn_like(ye, dtype=torch.float32)
        (ye.float() * dy).sum().backward()
        (yc.float() * dy).sum().backward()
        pairs = {"out": (yc, ye), "x.grad": (xc.grad, xe.grad)}
        for (name, pe), (_, pc) in zip(eager.named_parameters(), compiled.named_parameters()):
            pairs[f"{name}.grad"] = (pc.grad, pe.grad)
        for name, (c, e) in pairs.items():
            err = math.inf if c is None or e is None else _rel_err(c, e)
            errs[name] = max(errs.get(name, 0.0), err)
        for p in (*eager.parameters(), *compiled.parameters()):
            p.grad = None
    return errs


def _own_compile_caches(rank: int) -> None:
    """Per-rank Inductor and Triton caches: ranks compile the same kernels at the same time."""
    cache = tempfile.mkdtemp(prefix=f"overlap_gpu_test_r{rank}_")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache, "inductor")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")


def _tp_models(gn: str, dtype, device, seq: int) -> dict:
    """name: (model, input maker, passes expected in its forward graph). Batch 2, ``seq`` rows per
    rank, hidden 96, ffn 160 / 144 per rank (not multiples of 128)."""
    return {
        "tp_block": (TPBlock(96, 160, gn, dtype, device), lambda: _randn(2, seq, 96, dtype=dtype, device=device),
                     {"ag_mm", "mm_rs"}),
        "row_parallel_mlp": (RowParallelMLP(96, 144, gn, dtype, device),
                             lambda: _replicated_input(40, 96, dtype, device), {"mm_ar"}),
    }


def compiled_worker(rank: int, ws: int, device: str, lowering: str = "p2p", inductor: bool = True):
    import copy

    import torch.distributed as dist

    _own_compile_caches(rank)
    _setup_rank(rank, device)
    import overlap_backend

    gn = dist.group.WORLD.group_name
    dtype = torch.bfloat16
    tol = _tol(dtype)
    out: dict[str, object] = {}
    bad = []
    # p2p: sequence 6 per rank (not a multiple of 128); symm: 64, so that the reduce-scatter's runs
    # of rows fit a block height.
    models = _tp_models(gn, dtype, device, seq=64 if lowering == "symm" else 6)
    for name, (model, make_input, expected) in models.items():
        torch._dynamo.reset()
        backend = overlap_backend.make_backend(lowering=lowering, inductor=inductor)
        compiled = torch.compile(copy.deepcopy(model), backend=backend)
        errs = _compare_fwd_bwd(model, compiled, make_input, dtype)
        applied = sorted({(r.kind, m.pass_name) for r in backend.reports for m in r.matches if m.applied})
        rejected = [(r.kind, m.pass_name, m.reason) for r in backend.reports for m in r.matches if not m.applied]
        out[name] = {"errs": errs, "applied": applied, "rejected": rejected}
        for t, e in errs.items():
            if not e <= tol:
                bad.append(f"rank {rank}: {name}: {t} rel err {e:.3e} > {tol:g} (compiled vs eager)")
        missing = {p for p in expected if ("forward", p) not in applied}
        if missing:
            bad.append(f"rank {rank}: {name}: no applied {sorted(missing)} in the forward graph; "
                       f"applied {applied}, rejected {rejected}")
    out["paths"] = _paths()
    if lowering == "symm":
        off = [op for op in ("ag_mm", "mm_rs", "mm_ar") if not out["paths"].get(f"{op}:symm")]
        if off:
            bad.append(f"rank {rank}: {off} never ran on the symm kernels: {out['paths']}")
    assert not bad, "\n".join(bad)
    return out


def _replicated_input(tokens: int, hidden: int, dtype, device):
    import torch.distributed as dist

    x = _randn(tokens, hidden, dtype=dtype, device=device)
    dist.broadcast(x, src=0)  # the row-parallel MLP's input is the same on every rank
    return x


# ============================================================================ tests
LOWERINGS = pytest.mark.parametrize("lowering", ["p2p", "symm"])
# symm-peer: mm_rs / mm_ar ship partials with peer stores from the kernel (knobs.symm.TRANSPORT)
# symm-kernel: mm_rs on the Triton producer kernel (knobs.symm.MM_RS_GEMM) instead of cuBLAS
# symm-agcublas: ag_mm on cuBLAS per chunk (knobs.symm.AG_MM_GEMM) instead of the consumer kernel
# symm-rstma: mm_rs on the producer kernel's TMA variant (knobs.symm.RS_TMA) where it applies
# symm-artma: mm_ar on its rounds kernel's TMA variant (knobs.symm.AR_TMA) where it applies
# symm-perpeer: pushes to each peer on a stream of their own (knobs.symm.PUSH_STREAM_PER_PEER; ws > 2)
# symm-arcopy: mm_ar's rounds kernel copies the peers' reduced bands into out (knobs.symm.AR_KERNEL_COPY_OUT)
OP_LOWERINGS = pytest.mark.parametrize("lowering", ["p2p", "symm", "symm-peer", "symm-kernel", "symm-agcublas",
                                                    "symm-rstma", "symm-artma", "symm-perpeer", "symm-arcopy"])


@OP_LOWERINGS
@WORLD_SIZES
@pytest.mark.timeout(300)
def test_ops_numerics(ws, lowering):
    _need_gpus(ws, lowering)
    results = _run(numerics_worker, ws, lowering, timeout=280)
    worst: dict[tuple[str, str], float] = {}
    for per_rank in results:
        for label, dtype, err in per_rank:
            worst[(label, dtype)] = max(worst.get((label, dtype), 0.0), err)
    for (label, dtype), err in worst.items():
        print(f"ws={ws} {lowering} {label} {dtype}: max rel err {err:.2e}")


@OP_LOWERINGS
@WORLD_SIZES
@pytest.mark.timeout(200)
def test_repeated_calls(ws, lowering):
    _need_gpus(ws, lowering)
    for rank, summary in enumerate(_run(repeat_worker, ws, lowering)):
        print(f"ws={ws} {lowering} rank {rank}: {summary}")


@LOWERINGS
@WORLD_SIZES
@pytest.mark.timeout(200)
def test_two_groups_at_once(ws, lowering):
    _need_gpus(ws, lowering)
    for rank, summary in enumerate(_run(two_groups_worker, ws, lowering)):
        print(f"ws={ws} {lowering} rank {rank}: {summary}")


@LOWERINGS
@WORLD_SIZES
@pytest.mark.timeout(300)
def test_compiled_tp_models(ws, lowering):
    _need_gpus(ws, lowering, eager_all_gather=True)
    env = {"OVERLAP_INDUCTOR": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    results = _run(compiled_worker, ws, lowering, timeout=280, env=env)
    for name, res in results[0].items():
        if name == "paths":
            print(f"ws={ws} {lowering} paths: {res}")
            continue
        print(f"ws={ws} {lowering} {name}: errs {res['errs']}\n  applied {res['applied']}\n  rejected {res['rejected']}")


def reduce_overhead_worker(rank: int, ws: int, device: str, capture_on_symm: bool):
    """mode="reduce-overhead" (cudagraph trees) on the TP models, inference: the symm ops run their
    kernels in the eager warm-up; the capture runs them on symm with the toggling flag block
    (``capture_on_symm``, the default) or leaves them to p2p; every replay on fresh inputs matches
    eager."""
    import torch.distributed as dist

    _own_compile_caches(rank)
    _setup_rank(rank, device)
    import overlap_backend
    from overlap_backend.spec import knobs

    import faulthandler
    import sys
    import time

    faulthandler.dump_traceback_later(100, repeat=True)  # a run cut by its cap still shows where it was
    knobs.symm.set(CAPTURE_ON_SYMM=capture_on_symm)
    gn = dist.group.WORLD.group_name
    dtype = torch.bfloat16
    models = _tp_models(gn, dtype, device, seq=64)
    out, bad = {}, []
    start = time.monotonic()
    with torch.no_grad():
        for name, (model, make_input, _) in models.items():
            torch._dynamo.reset()
            backend = overlap_backend.make_backend(lowering="symm")
            compiled = torch.compile(model, backend=backend, mode="reduce-overhead")
            errs = []
            for i in range(6):
                x = make_input()
                got = compiled(x).clone()
                errs.append(_rel_err(got, model(x)))
                print(f"rank {rank} [{time.monotonic() - start:.0f} s] {name} call {i}: rel err {errs[-1]:.1e}",
                      file=sys.stderr, flush=True)
            out[name] = max(errs)
            if not max(errs) <= _tol(dtype):
                bad.append(f"rank {rank}: {name}: rel errs {errs}")
    # 2xH200, 2026-11-30: every replay matched within 9 s, then the worker hung past the harness'
    # 280 s after returning (in destroy_process_group or the release before it?). The stack dumps
    # stay armed through the teardown; the graphs are dropped first, each step announced.
    print(f"rank {rank} [{time.monotonic() - start:.0f} s] replays done; dropping the graphs", file=sys.stderr, flush=True)
    del compiled, models
    torch._dynamo.reset()
    from torch._inductor import cudagraph_trees

    cudagraph_trees.reset_cudagraph_trees()
    torch.cuda.synchronize()
    print(f"rank {rank} [{time.monotonic() - start:.0f} s] graphs dropped; the harness destroys the group next",
          file=sys.stderr, flush=True)
    out["paths"] = _paths()
    went_p2p = [k for k in out["paths"] if k.endswith(":p2p")]
    if capture_on_symm and went_p2p:
        bad.append(f"rank {rank}: calls went to p2p with the captured symm path on: {out['paths']}")
    if not capture_on_symm and not went_p2p:
        bad.append(f"rank {rank}: no call inside the capture went to p2p: {out['paths']}")
    assert not bad, "\n".join(bad)
    return out


@pytest.mark.parametrize("capture", ["capture_symm", "capture_p2p"])
@WORLD_SIZES
@pytest.mark.timeout(300)
def test_symm_reduce_overhead_tp_models(ws, capture):
    _need_gpus(ws, eager_all_gather=True)
    env = {"OVERLAP_INDUCTOR": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    print(_run(reduce_overhead_worker, ws, capture == "capture_symm", timeout=280, env=env)[0])


def reduce_overhead_train_worker(rank: int, ws: int, device: str):
    """mode="reduce-overhead" in training: the TP models' forward and backward graphs replayed from
    CUDA graphs with their ag_mm / mm_rs / mm_ar captured on symm; 6 steps on fresh inputs, output,
    input grad and parameter grads against eager each step; no call may run on p2p."""
    import copy

    import torch.distributed as dist

    _own_compile_caches(rank)
    _setup_rank(rank, device)
    import overlap_backend

    gn = dist.group.WORLD.group_name
    dtype = torch.bfloat16
    out, bad = {}, []
    for name, (model, make_input, _) in _tp_models(gn, dtype, device, seq=64).items():
        torch._dynamo.reset()
        compiled = torch.compile(copy.deepcopy(model), backend=overlap_backend.make_backend(lowering="symm"),
                                 mode="reduce-overhead")
        errs = _compare_fwd_bwd(model, compiled, make_input, dtype, steps=6,
                                before_step=torch.compiler.cudagraph_mark_step_begin)
        out[name] = max(errs.values())
        bad += [f"rank {rank}: {name}: {t} rel err {e:.3e}" for t, e in errs.items() if not e <= _tol(dtype)]
    del compiled
    torch._dynamo.reset()
    from torch._inductor import cudagraph_trees

    cudagraph_trees.reset_cudagraph_trees()
    torch.cuda.synchronize()
    out["paths"] = _paths()
    if any(k.endswith(":p2p") for k in out["paths"]) or not out["paths"].get("ag_mm:symm"):
        bad.append(f"rank {rank}: expected every call on symm: {out['paths']}")
    assert not bad, "\n".join(bad)
    return out


@pytest.mark.timeout(300)
def test_symm_reduce_overhead_training():
    _need_gpus(2, eager_all_gather=True)
    env = {"OVERLAP_INDUCTOR": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    print(_run(reduce_overhead_train_worker, 2, timeout=280, env=env)[0])


def late_peer_worker(rank: int, ws: int, device: str, group=None):
    """The late peer of ``_late_peer`` on eager calls (no private graph: each call's flags are known)."""
    from overlap_backend.spec import knobs

    with knobs.symm.patch(PRIVATE_GRAPHS=False):
        return _late_peer(rank, ws, device, group)


def _late_peer(rank: int, ws: int, device: str, group=None):
    """Rank 1 calls ag_mm 3 s after rank 0, whose kernel gives up after 1 s: rank 0 gets a
    SymmTimeoutError naming the op, its rank and the flag. Rank 0's watchdog then released its waits
    and told rank 1 (symm_layout.PEER_OK): rank 1's result is right (what rank 0 pushed was its shard), but
    its call stalls at its end until its own watchdog fires, and it raises naming rank 0 as the
    peer that gave up first: a rank never goes on with what a peer sent after giving up."""
    import time

    import torch.distributed as dist

    _setup_rank(rank, device)
    from overlap_backend.runtime import cuda as _cuda
    from overlap_backend.runtime import symm
    from overlap_backend.spec import symm_layout

    group = group or dist.group.WORLD  # (the smoke set runs it on a group of its own)
    dtype = torch.bfloat16
    shard = _randn(64, 128, dtype=dtype, device=device)
    w = _randn(128, 256, dtype=dtype, device=device, scale=128**-0.5)
    ref = _gather_ref(shard, 0, group).float() @ w.float()
    # Set up buffers and compile/tune the kernel first, under the default bound (a cold compile
    # skews the ranks by seconds), so that the only delay is the sleep below.
    torch.ops.overlap.ag_mm(shard, [w], [None], 0, group.group_name, "symm", False)
    torch.cuda.synchronize()
    _group_state(group, device).set_timeout(1.0)
    dist.barrier(group=group)
    if rank == 1:
        time.sleep(3.0)
    out = torch.ops.overlap.ag_mm(shard, [w], [None], 0, group.group_name, "symm", False)[1][0]
    torch.cuda.synchronize()
    if rank == 0:
        try:
            _group_state(group, device).check_status()
        except symm.SymmTimeoutError as e:
            msg = str(e)
            assert "ag_mm" in msg and "rank 0" in msg and "rank 1's shard" in msg, msg
            try:
                torch.ops.overlap.ag_mm(shard, [w], [None], 0, group.group_name, "symm", False)
            except symm.SymmTimeoutError:
                return msg
            raise AssertionError("the next call after a timeout did not raise")
        st = _group_state(group, device)
        flags = _cuda.as_tensor(st.flags.local, 4 * symm_layout.FLAG_WORDS, st.device).view(torch.int32)
        raise AssertionError(
            "rank 0 did not time out although rank 1 was 3 s late: status words "
            f"{list(st.status)}, timeout_ns {st.timeout_ns}, epoch {st.epoch}, READY {flags[:ws].tolist()}, "
            f"AG_ARRIVED {flags[symm_layout.AG_ARRIVED:symm_layout.AG_ARRIVED + 2 * symm_layout.MAX_BANDS].tolist()}, "
            f"claim {flags[symm_layout.CLAIM].item()}")
    err = _rel_err(out, ref)
    assert err <= _tol(dtype), err
    try:
        _group_state(group, device).check_status()
    except symm.SymmTimeoutError as e:
        msg = str(e)
        assert "ag_mm on rank 1" in msg and "Rank(s) [0] had given up" in msg, msg
        return f"late rank's result ok (rel err {err:.1e}), then it raised: {msg}"
    raise AssertionError("rank 1 went on although rank 0 had given up the call")


@pytest.mark.timeout(200)
def test_symm_timeout_names_op_rank_flag():
    _need_gpus(2)
    results = _run(late_peer_worker, 2, timeout=90)
    print(results)


def growth_disagreement_worker(rank: int, ws: int, device: str):
    """ag_mm called with shards of different sizes (a user error) never hangs in the data buffer's
    growth. First call, 64 vs 96 rows per shard: both ranks need a new buffer, of different sizes:
    both raise SymmMismatchError before anything runs, and an equal call then works. Later, 4096 rows
    on rank 0 (it must grow) vs 64 on rank 1 (its buffer suffices: it runs): rank 0 raises
    SymmTimeoutError after the 2 s bound naming rank 1, and tells it; rank 1's watchdog gives its call
    up: it raises too."""
    import time

    import torch.distributed as dist

    from overlap_backend.runtime import symm

    group = dist.group.WORLD
    gn = group.group_name
    w = _randn(256, 512, dtype=torch.bfloat16, device=device)
    call = lambda rows: torch.ops.overlap.ag_mm(  # noqa: E731
        _randn(rows, 256, dtype=torch.bfloat16, device=device), [w], [None], 0, gn, "symm", False)
    try:
        call(64 if rank == 0 else 96)
        raise AssertionError("shards of different sizes went through the growth")
    except symm.SymmMismatchError as e:
        first = str(e)
    assert "data buffers of" in first and "Nothing ran" in first, first
    shard = _randn(64, 256, dtype=torch.bfloat16, device=device)
    out = torch.ops.overlap.ag_mm(shard, [w], [None], 0, gn, "symm", False)[1][0]
    ref = _gather_ref(shard, 0, group).float() @ w.float()
    err = _rel_err(out, ref)
    assert err <= _tol(torch.bfloat16), err
    _group_state(group, device).set_timeout(2.0)
    dist.barrier()
    start = time.monotonic()
    try:
        call(4096 if rank == 0 else 64)
        torch.cuda.synchronize()
        symm.check_status()
        raise AssertionError("a call that only rank 0 grew for went through")
    except symm.SymmTimeoutError as e:
        second, took = str(e), time.monotonic() - start
    # rank 1 ran its call: its watchdog gives it up (rank 0's word that it gave up may or may not be
    # in by then: a race of ~0.7 s)
    want = "rank(s) [1] did not come within 2 s" if rank == 0 else "ag_mm on rank 1"
    assert want in second and took < 20, (took, second)
    return f"equal call after the mismatch: rel err {err:.1e}; {first} | after {took:.1f} s: {second}"


@pytest.mark.timeout(120)
def test_symm_growth_disagreement_raises_instead_of_hanging():
    _need_gpus(2)
    for rank, msg in enumerate(_run(growth_disagreement_worker, 2, timeout=100)):
        print(f"rank {rank}: {msg}")


def test_stream_operations_fast_path():
    """The ctypes entry points of the hot stream operations load, use cuda.h's flag values, and
    do what they say on one GPU: a copy, a flag write, and a wait that a later write releases."""
    _need_gpus(1)
    from overlap_backend.runtime import cuda as c

    assert c._fast() is not None, "libcuda.so.1 entry points not found: every call goes through cuda-python"
    driver, _ = c._bindings()
    assert c._WAIT_VALUE_GEQ == int(driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ)
    assert c._WRITE_VALUE_DEFAULT == int(driver.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT)
    src = torch.randn(1 << 16, device="cuda")
    dst = torch.full_like(src, float("nan"))
    flags = torch.zeros(2, dtype=torch.int32, device="cuda")
    waiter, writer = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
    c.wait_value32(flags.data_ptr() + 4, 7, waiter)  # the copy waits for flag 1 >= 7
    c.memcpy_async(dst.data_ptr(), src.data_ptr(), src.numel() * 4, waiter)
    c.write_value32(flags.data_ptr(), 3, waiter)
    time.sleep(0.2)
    assert not waiter.query(), "the wait did not hold the stream"
    c.write_value32(flags.data_ptr() + 4, 7, writer)
    waiter.synchronize()
    assert torch.equal(dst, src) and flags.tolist() == [3, 7]


def test_fast_triton_launch_matches_tritons_own():
    """``codegen.launcher``'s fast path (a seen variant's launcher called directly) computes what
    Triton's launch computes, on fresh tensors and scalars each call, and a scalar that Triton
    specialises (== 1) or a new constexpr takes a variant of its own."""
    _need_gpus(1)
    import triton
    import triton.language as tl

    from overlap_backend.codegen import launcher
    from overlap_backend.spec import knobs

    @triton.jit
    def axpy(x_ptr, y_ptr, out_ptr, n, a, SCALE: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        y = tl.load(y_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, (a * x + y) * SCALE, mask=mask)

    assert knobs.codegen.FAST_LAUNCH and not launcher._launch_hooks()
    before = len(launcher._fast_launches)
    for i, (n, a, scale) in enumerate([(1000, 3, 1), (777, 5, 1), (1, 1, 1), (4097, 2, 1), (5000, 7, 2), (999, 9, 2)]):
        x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        out = torch.full((n,), float("nan"), device="cuda")
        launcher.launch(axpy, (triton.cdiv(n, 256),), x, y, out, n, a, SCALE=scale, BLOCK=256)
        torch.testing.assert_close(out, (a * x + y) * scale, rtol=1e-6, atol=1e-6, msg=f"launch {i}")
    fast = [v for k, v in launcher._fast_launches.items() if k[0] is axpy]
    assert len(launcher._fast_launches) > before and all(v is not launcher._NO_FAST_LAUNCH for v in fast), fast
    assert len(fast) >= 3, "n == 1 and SCALE=2 must be variants of their own"


DEAD_PEER_TIMEOUT_S = 2.0  # set after the warm-up call (GroupState.set_timeout)


def dead_peer_worker(rank: int, ws: int, device: str, group=None):
    """The dead peer of ``_dead_peer`` on eager calls (no private graph: each call's flags are known)."""
    from overlap_backend.spec import knobs

    with knobs.symm.patch(PRIVATE_GRAPHS=False):
        return _dead_peer(rank, ws, device, group)


def _dead_peer(rank: int, ws: int, device: str, group=None):
    """Rank 1 skips the second call (as if it died). Rank 0's copy-engine pushes wait for rank 1's
    READY flag in ``cuStreamWaitValue32``, which has no timeout: without the watchdog its
    synchronize would never return. With it, the synchronize returns within ~1.25x
    the timeout, the next check raises SymmTimeoutError and so does every later call."""
    import time

    import torch.distributed as dist

    _setup_rank(rank, device)
    from overlap_backend.runtime import symm
    from overlap_backend.spec import knobs

    group = group or dist.group.WORLD  # (the smoke set runs it on a group of its own)
    timeout_s = DEAD_PEER_TIMEOUT_S
    dtype = torch.bfloat16
    shard = _randn(64, 128, dtype=dtype, device=device)
    w = _randn(128, 256, dtype=dtype, device=device, scale=128**-0.5)
    torch.ops.overlap.ag_mm(shard, [w], [None], 0, group.group_name, "symm", True)  # (default bound)
    torch.cuda.synchronize()
    st = _group_state(group, device)
    st.set_timeout(timeout_s)
    dist.barrier(group=group)
    torch.cuda.synchronize()
    if rank == 1:
        time.sleep(timeout_s * knobs.symm.WATCHDOG_FACTOR + 8)  # alive (its buffers mapped), never calling
        return "skipped the call"
    start = time.monotonic()
    torch.ops.overlap.ag_mm(shard, [w], [None], 0, group.group_name, "symm", True)  # gathered: a copy-stream wait too
    torch.cuda.synchronize()
    took = time.monotonic() - start
    assert took < timeout_s * knobs.symm.WATCHDOG_FACTOR + 3, f"synchronize returned after {took:.1f} s"
    assert st.stalled is not None and "ag_mm on rank 0" in st.stalled, st.stalled
    try:
        st.check_status()
    except symm.SymmTimeoutError as e:
        msg = str(e)
    else:
        raise AssertionError(f"no error after the dead peer's call: status {list(st.status)}")
    try:
        torch.ops.overlap.ag_mm(shard, [w], [None], 0, group.group_name, "symm", False)
    except symm.SymmTimeoutError:
        return f"synchronize returned after {took:.2f} s; raised: {msg}"
    raise AssertionError("the next call after the watchdog fired did not raise")


@pytest.mark.timeout(200)
def test_symm_dead_peer_unblocks_stream_waits():
    _need_gpus(2)
    print(_run(dead_peer_worker, 2, timeout=90))


def late_peer_private_replay_worker(rank: int, ws: int, device: str, group=None):
    """Rank 1 replays its private graph of an eager ag_mm (``knobs.symm.PRIVATE_GRAPHS``) 3 s after rank 0,
    whose call gives up after 1 s: rank 0's check raises a SymmTimeoutError naming the op of the replay and
    its next call raises. Rank 1's replay ends (rank 0 released its waits), and its next call, which rank 0
    never joins, ends in a SymmTimeoutError within the bound: no rank hangs or goes on unwarned."""
    import time

    import torch.distributed as dist

    _setup_rank(rank, device)
    from overlap_backend.runtime import symm
    from overlap_backend.runtime.symm import private_graphs
    from overlap_backend.spec import knobs

    group = group or dist.group.WORLD
    dtype = torch.bfloat16
    shard = _randn(64, 128, dtype=dtype, device=device)
    w = _randn(128, 256, dtype=dtype, device=device, scale=128**-0.5)
    st = None

    def call():
        return torch.ops.overlap.ag_mm(shard, [w], [None], 0, group.group_name, "symm", False)[1][0]

    def timed():
        """(the SymmTimeoutError's message or None, seconds) of one call, synchronised and checked."""
        start = time.monotonic()
        try:
            call()
            torch.cuda.synchronize()
            st.check_status()
        except symm.SymmTimeoutError as e:
            return str(e), time.monotonic() - start
        return None, time.monotonic() - start

    with knobs.symm.patch(PRIVATE_GRAPHS=True):
        for _ in range(3):  # unbound, the captured protocol's eager run, the capture (default bound)
            call()
        torch.cuda.synchronize()
        st = _group_state(group, device)
        st.set_timeout(1.0)
        replays = private_graphs.STATS["replays"]
        dist.barrier(group=group)
        if rank == 1:
            time.sleep(3.0)
        msg, took = timed()
        assert private_graphs.STATS["replays"] == replays + 1, "the call was not a private replay"
        if rank == 0:
            assert msg is not None, f"rank 0 did not time out although rank 1 was 3 s late ({took:.1f} s)"
            assert "ag_mm" in msg and "rank 0" in msg, msg
            try:
                call()
            except symm.SymmTimeoutError:
                return f"raised after {took:.1f} s: {msg}"
            raise AssertionError("the next call after a timeout did not raise")
        if msg is not None:
            return f"the late rank raised after {took:.1f} s: {msg}"
        msg, took = timed()
        if msg is not None:
            assert took < 1.0 * knobs.symm.WATCHDOG_FACTOR + 3, f"raised after {took:.1f} s"
            return f"the late rank's replay ended; its next call raised after {took:.1f} s: {msg}"
        raise AssertionError("rank 1 went on calling although rank 0 had given up the group")


def dead_peer_replay_worker(rank: int, ws: int, device: str, group=None):
    """As dead_peer_worker, inside a CUDA-graph replay: both ranks capture an ag_mm (returning the
    gathered input: a copy-stream wait too) and replay it once together; then rank 1 skips a replay.
    Rank 0's replay waits in stream waits for rank 1's READY; the watchdog sees the replay in flight
    (GRAPH_STARTED / GRAPH_FINISHED, counted by a captured kernel) and releases it: the synchronize
    returns within ~1.25x the timeout and check_status raises."""
    import time

    import torch.distributed as dist

    _setup_rank(rank, device)
    from overlap_backend.runtime import symm
    from overlap_backend.spec import knobs, symm_layout

    knobs.symm.set(CAPTURE_ON_SYMM=True)
    group = group or dist.group.WORLD  # (the smoke set runs it on a group of its own)
    timeout_s = DEAD_PEER_TIMEOUT_S
    dtype = torch.bfloat16
    shard = _randn(64, 128, dtype=dtype, device=device)
    w = _randn(128, 256, dtype=dtype, device=device, scale=128**-0.5)

    def call():
        return torch.ops.overlap.ag_mm(shard, [w], [None], 0, group.group_name, "symm", True)

    call()  # (default bound: see late_peer_worker)
    torch.cuda.synchronize()
    st = _group_state(group, device)
    st.set_timeout(timeout_s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    dist.barrier(group=group)
    graph.replay()
    torch.cuda.synchronize()
    counts = (st.status[symm_layout.GRAPH_STARTED], st.status[symm_layout.GRAPH_FINISHED])
    assert counts == (1, 1), f"replay counters {counts}, expected (1, 1)"
    dist.barrier(group=group)
    torch.cuda.synchronize()
    if rank == 1:
        time.sleep(timeout_s * knobs.symm.WATCHDOG_FACTOR + 8)  # alive (its buffers mapped), never replaying
        return "skipped the replay"
    start = time.monotonic()
    graph.replay()
    torch.cuda.synchronize()
    took = time.monotonic() - start
    assert took < timeout_s * knobs.symm.WATCHDOG_FACTOR + 3, f"synchronize returned after {took:.1f} s"
    assert st.stalled is not None, "the watchdog did not fire"
    try:
        st.check_status()
    except symm.SymmTimeoutError as e:
        return f"synchronize returned after {took:.2f} s; raised: {e}"
    raise AssertionError(f"no error after the dead peer's replay: status {list(st.status)}")


@pytest.mark.timeout(200)
def test_symm_dead_peer_in_a_replay():
    _need_gpus(2)
    print(_run(dead_peer_replay_worker, 2, timeout=90))


def captured_symm_worker(rank: int, ws: int, device: str):
    """knobs.symm.CAPTURE_ON_SYMM: ag_mm (returning the gathered input), mm_rs (the kernel, its TMA
    variant, cuBLAS), and mm_ar one-shot and in rounds captured in one CUDA graph after eager warm-up calls (which set the group up, size
    its buffer and tune); 12 replays on fresh inputs with poisoned outputs, eager calls of the same
    ops in between (the epoch block and the graph block interleaved), everything against NCCL +
    float32 matmuls."""
    import torch.distributed as dist

    _setup_rank(rank, device)
    from overlap_backend.spec import knobs

    # RS_TMA: whole-tile chunks (y8) on the kernel's TMA variant, the others as before; AG_*: ag_mm with at
    # least 1024 columns in all on cuBLAS per chunk (y6), the narrower one (y1) on the kernel
    knobs.symm.set(CAPTURE_ON_SYMM=True, TRANSPORT="ce", RS_TMA="only", AG_MM_GEMM="cublas", AG_CUBLAS_MIN_N=1024)
    group = dist.group.WORLD
    gn, dtype = group.group_name, torch.bfloat16
    x = _randn(200, 512, dtype=dtype, device=device)  # 200 rows: not a multiple of any block height
    x6 = _randn(136, 512, dtype=dtype, device=device)
    w6 = [_randn(n, 512, dtype=dtype, device=device, scale=512**-0.5).t() for n in (640, 512)]
    w1 = _randn(384, 512, dtype=dtype, device=device, scale=512**-0.5).t()  # nn.Linear layout
    a = _randn(ws * 100, 256, dtype=dtype, device=device)
    w2 = _randn(256, 320, dtype=dtype, device=device, scale=256**-0.5)
    a1 = _randn(256, 128, dtype=dtype, device=device)  # mm_ar one-shot (small partial)
    a2 = _randn(4096, 128, dtype=dtype, device=device)  # mm_ar in rounds
    w3 = _randn(128, 1024, dtype=dtype, device=device, scale=128**-0.5)
    a5 = _randn(ws * 1024, 2048, dtype=dtype, device=device)  # mm_rs on cuBLAS (above, the kernel)
    w5 = _randn(2048, 256, dtype=dtype, device=device, scale=2048**-0.5)
    a8 = _randn(ws * 512, 512, dtype=dtype, device=device)  # mm_rs on the kernel, whole tiles: its TMA variant
    w8 = _randn(512, 256, dtype=dtype, device=device, scale=512**-0.5)

    def ops():
        gathered, (y1,) = torch.ops.overlap.ag_mm(x, [w1], [None], 0, gn, "symm", True)
        y2 = torch.ops.overlap.mm_rs(a, w2, None, [ws * 100, 320], 0, "sum", gn, "symm")
        y3 = torch.ops.overlap.mm_ar(a1, w3, None, "sum", gn, "symm")
        y4 = torch.ops.overlap.mm_ar(a2, w3, None, "sum", gn, "symm")
        y5 = torch.ops.overlap.mm_rs(a5, w5, None, [ws * 1024, 256], 0, "sum", gn, "symm")
        _, (y6, y7) = torch.ops.overlap.ag_mm(x6, w6, [None, None], 0, gn, "symm", False)
        y8 = torch.ops.overlap.mm_rs(a8, w8, None, [ws * 512, 256], 0, "sum", gn, "symm")
        return gathered, y1, y2, y3, y4, y5, y6, y7, y8

    def check(outs, label):
        gathered, y1, y2, y3, y4, y5, y6, y7, y8 = outs
        G6 = _gather_ref(x6, 0, group).float()
        G = _gather_ref(x, 0, group)
        errs = {"gathered": 0.0 if torch.equal(gathered, G) else math.inf,
                "ag_mm": _rel_err(y1, G.float() @ w1.float()),
                "mm_rs": _rel_err(y2, _all_reduce_ref(a.float() @ w2.float(), group).chunk(ws, 0)[rank]),
                "mm_ar one-shot": _rel_err(y3, _all_reduce_ref(a1.float() @ w3.float(), group)),
                "mm_ar rounds": _rel_err(y4, _all_reduce_ref(a2.float() @ w3.float(), group)),
                "mm_rs cuBLAS": _rel_err(y5, _all_reduce_ref(a5.float() @ w5.float(), group).chunk(ws, 0)[rank]),
                "ag_mm cuBLAS": max(_rel_err(y6, G6 @ w6[0].float()), _rel_err(y7, G6 @ w6[1].float())),
                "mm_rs TMA": _rel_err(y8, _all_reduce_ref(a8.float() @ w8.float(), group).chunk(ws, 0)[rank])}
        bad = {k: v for k, v in errs.items() if not v <= _tol(dtype)}
        assert not bad, f"rank {rank} {label}: {errs}"
        return max(errs.values())

    for i in range(2):  # eager warm-up: state, data buffer, block configs
        check(ops(), f"eager warm-up {i}")
    torch.cuda.synchronize()
    before = _paths()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_outs = ops()
    captured = {k: v - before.get(k, 0) for k, v in _paths().items() if v != before.get(k, 0)}
    assert not any(k.endswith(":p2p") for k in captured), f"rank {rank}: captured calls went to p2p: {captured}"
    assert captured.get("ag_mm:symm") == 2 and captured.get("mm_rs:symm") == 3, captured
    assert captured.get("ag_mm:symm:cublas") == 1 and captured.get("ag_mm:symm:triton") == 1, captured
    assert captured.get("mm_rs:symm:cublas") == 1 and captured.get("mm_rs:symm:triton") == 2, captured
    assert captured.get("mm_rs:symm:triton-tma") == 1, captured
    worst = 0.0
    for i in range(12):
        for t in (x, a, a1, a2, a5, x6, a8):
            t.copy_(torch.randn(t.shape, device=device).to(dtype))
        for t in static_outs:
            t.fill_(float("nan"))
        graph.replay()
        worst = max(worst, check(static_outs, f"replay {i}"))
        if i % 3 == 1:
            worst = max(worst, check(ops(), f"eager call after replay {i}"))
    torch.cuda.synchronize()
    del graph
    return f"captured {captured}; 12 replays + 4 eager calls, max rel err {worst:.1e}"


@pytest.mark.timeout(200)
def test_captured_symm_ops_replay():
    _need_gpus(2)
    print(_run(captured_symm_worker, 2, timeout=180))


def recompile_state_worker(rank: int, ws: int, device: str, lowering: str):
    """A function compiled for three token counts (a recompile each, OVERLAP_INDUCTOR=0): every
    graph's ops run on the one per-group state of the lowering; the symm data buffer is the same
    allocation unless it had to grow."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    _setup_rank(rank, device)
    import overlap_backend
    from overlap_backend.runtime import p2p
    from overlap_backend.runtime.symm import registry

    group = dist.group.WORLD
    dtype = torch.bfloat16
    w = _randn(256, 512, dtype=dtype, device=device, scale=256**-0.5)

    def f(x):
        return funcol.all_gather_tensor(x, 0, group) @ w

    torch._dynamo.reset()
    backend = overlap_backend.make_backend(lowering=lowering, inductor=False, passes=["ag_mm"])
    compiled = torch.compile(f, backend=backend, dynamic=False)
    seen = []
    for rows in (64, 128, 64, 512):
        x = _randn(rows, 256, dtype=dtype, device=device)
        out = compiled(x)
        if device == "cuda":
            torch.cuda.synchronize()
        err = _rel_err(out, _gather_ref(x, 0, group).float() @ w.float())
        assert err <= _tol(dtype), (rows, err)
        if lowering == "symm":
            states = [st for (name, _), st in registry.states.items() if name == group.group_name]
            assert len(states) == 1, registry.states
            st = states[0]
            seen.append((id(st), st.data.local, st.data.nbytes, len(st._views)))
        else:
            seen.append((id(p2p._GROUPS[group.group_name]), 0, 0, 0))
    graphs = sum(any(m.applied for m in r.matches) for r in backend.reports)
    assert graphs >= 3, [r.to_json() for r in backend.reports]
    assert len({s[0] for s in seen}) == 1, seen
    for (_, ptr0, size0, _), (_, ptr1, size1, _) in zip(seen, seen[1:]):
        assert size1 >= size0 and (size1 > size0 or ptr1 == ptr0), seen  # reused unless grown
    return seen


@LOWERINGS
@pytest.mark.timeout(200)
def test_recompiles_reuse_group_state(lowering):
    _need_gpus(2, lowering)
    for rank, seen in enumerate(_run(recompile_state_worker, 2, lowering)):
        print(f"{lowering} rank {rank}: (state id, data ptr, data bytes, views) per call {seen}")


def wide_tile_rounds_worker(rank: int, ws: int, device: str):
    """mm_ar in rounds on the copy-engine transport with the widest block config (128 x 256 tiles,
    8 warps, 3 stages: one CTA fills an SM), forced on every rank: 3 calls against the all-reduce."""
    import torch.distributed as dist

    from overlap_backend.runtime import symm
    from overlap_backend.runtime.symm import lowering_helpers

    m, k, n = 2048, 128, 8192  # 2 rounds, 512 tiles: the kernel's CTAs spin on pushed partials
    gn = dist.group.WORLD.group_name
    lowering_helpers.tuned_configs[("mm_ar", (m, n, k, "torch.bfloat16", False))] = (128, 256, 64, 8, 3, 8, False)
    a = _randn(m, k, dtype=torch.bfloat16, device=device)
    b = _randn(k, n, dtype=torch.bfloat16, device=device)
    ref = _all_reduce_ref(a.float() @ b.float(), dist.group.WORLD)
    before = lowering_helpers.PATHS["mm_ar:symm"]
    errs = []
    for _ in range(3):
        out = torch.ops.overlap.mm_ar(a, b, None, "sum", gn, "symm")
        errs.append(_rel_err(out, ref))
    torch.cuda.synchronize()
    return errs, lowering_helpers.PATHS["mm_ar:symm"] - before, symm.state(gn, a.device).num_sms


@pytest.mark.timeout(120)
def test_mm_ar_rounds_with_sm_filling_tiles():
    """Ranks sharing one GPU (OVERLAP_TEST_SHARED_GPU) copy between each other's buffers with a driver
    kernel on the SMs: with every SM held by this config's spinning CTAs the pushes never ran and both
    ranks hung, unless the grids of both leave knobs.symm.SHARED_DEVICE_FREE_SMS free (each rank half the rest)."""
    from overlap_backend.spec import knobs

    _need_gpus(2)
    for rank, (errs, symm_calls, sms) in enumerate(_run(wide_tile_rounds_worker, 2, timeout=100)):
        print(f"rank {rank}: rel err per call {errs}, symm calls {symm_calls}, kernel SMs {sms}")
        assert symm_calls == 3 and all(e < _tol(torch.bfloat16) for e in errs), (rank, errs, symm_calls)
        props = torch.cuda.get_device_properties(0).multi_processor_count
        assert sms == ((props - knobs.symm.SHARED_DEVICE_FREE_SMS) // 2 if shared_gpu() else props), (sms, props)


def host_time_worker(rank: int, ws: int, device: str):
    """calibrate.measure_host on the symm lowering (what `torchrun -m overlap_backend.tools.calibrate` now
    measures for symm_call_ms): the host ms per call of each probe, and the symm paths its calls took."""
    import torch.distributed as dist

    from overlap_backend.tools import calibrate
    from overlap_backend.runtime.symm import lowering_helpers

    before = dict(lowering_helpers.PATHS)
    host = calibrate.measure_host(dist.group.WORLD, torch.device("cuda", torch.cuda.current_device()), calls=20)
    took = {k: v - before.get(k, 0) for k, v in lowering_helpers.PATHS.items() if v != before.get(k, 0)}
    return host, took


def test_calibrate_measures_symm_host_time():
    _need_gpus(2)
    from overlap_backend.tools import calibrate

    out = _run(host_time_worker, 2, timeout=200)
    print(out)
    (host, took), (host1, _) = out
    assert host == host1 and set(host) == set(calibrate.HOST_PROBES), out  # the largest over the ranks
    assert all(0 < ms < 20 for ms in host.values()), host
    for path in ("ag_mm:symm", "mm_rs:symm", "mm_ar:oneshot"):
        assert took.get(path), (path, took)  # on the symm lowering, not its p2p fallback
