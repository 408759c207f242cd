"""GPU tests (marker ``gpu``) of fused epilogues, on 2, 4 and 8 GPUs, both lowerings.

Run on the device machine: ``python -m pytest -q -m gpu tests/gpu/test_gpu_epilogues.py``; where fewer
GPUs are visible every test skips. Same pattern as tests/gpu/test_gpu.py (whose helpers it uses): one
process per GPU through ``dist_harness.run_ranks(..., backend="nccl")``.

- the ops with an epilogue (``ag_mm``: bias + GELU, GELU-tanh + scale, SwiGLU of two outputs, a
  residual add; ``mm_rs``: residual add, scale, GELU, cast to float32, on the kernel and on the
  cuBLAS path (epilogue in its reducing kernel); ``mm_ar``: one-shot and
  rounds paths with a residual add + SiLU) against a float32 reference (NCCL collective, float32
  matmul, the steps in float32) in bf16, fp16 and fp32, outputs poisoned by running each case after
  NaN-filled allocations; on ``symm`` the kernels' path must be taken (``PATHS``);
- the demo block and the SwiGLU MLP compiled with Inductor, fusion on and off, inference, against
  eager (bf16 tolerance), with the captured specs the same on every rank;
- ``ag_mm``'s epilogues run apart, after its kernel, where a ratio file measured that faster: the path taken
  and the numerics (2 ranks).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import torch

try:
    from test_gpu import (_all_reduce_ref, _gather_ref, _need_gpus, _paths, _randn, _rel_err, _run, _setup_rank,
                          _tol, _use_lowering)
except ImportError:  # imported as tests.gpu.test_gpu_epilogues
    from tests.gpu.test_gpu import (_all_reduce_ref, _gather_ref, _need_gpus, _paths, _randn, _rel_err, _run,
                                _setup_rank, _tol, _use_lowering)

pytestmark = pytest.mark.gpu

WORLD_SIZES = pytest.mark.parametrize("ws", [2, 4, 8], ids=["ws2", "ws4", "ws8"])
LOWERINGS = pytest.mark.parametrize("lowering", ["p2p", "symm", "symm-peer"])
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _ref_epilogue(spec, x, args, outs=()):
    """The steps in float32 (casts dropped): the reference every lowering must meet."""
    from overlap_backend.spec import epilogue as spec_mod

    steps = [s for s in spec_mod.parse(spec) if s.kind != "cast"]
    return spec_mod.apply(spec_mod.format_spec(steps), x.float(), [a.float() for a in args],
                          [o.float() if o is not None else None for o in outs])


def _poison(device):
    """Fill the caching allocator's free blocks with NaN so that a missed store shows."""
    if device == "cuda":
        junk = torch.full((64 << 20,), float("nan"), device=device)
        del junk


def _ag_case(group, dtype, device, lowering, rows, k, ns, spec, n_args):
    ws = group.size()
    shard = _randn(rows, k, dtype=dtype, device=device)
    weights = [_randn(k, n, dtype=dtype, device=device, scale=k**-0.5) for n in ns]
    G = _gather_ref(shard, 0, group).float()
    args = [_randn(ns[0], dtype=dtype, device=device), _randn(ws * rows, ns[0], dtype=dtype, device=device)][:n_args]
    _poison(device)
    _, outs = torch.ops.overlap.ag_mm(shard, weights, [None] * len(ns), 0, group.group_name, lowering, False, spec,
                                      args)
    from overlap_backend.spec import epilogue as spec_mod

    specs = spec_mod.split_outputs(spec, len(ns))
    raw = [G @ w.float() for w in weights]
    # the reference of a swiglu reads the other output's final value (its own spec is empty here)
    refs = [_ref_epilogue(s, r, args, raw) if s else r for s, r in zip(specs, raw)]
    return max(_rel_err(o, r) for o, r in zip(outs, refs))


def _rs_case(group, dtype, device, lowering, rows, k, n, spec):
    ws, r = group.size(), group.rank()
    a = _randn(ws * rows, k, dtype=dtype, device=device)
    b = _randn(k, n, dtype=dtype, device=device, scale=k**-0.5)
    residual = _randn(rows, n, dtype=dtype, device=device)
    _poison(device)
    out = torch.ops.overlap.mm_rs(a, b, None, [ws * rows, n], 0, "sum", group.group_name, lowering, spec, [residual])
    full = _all_reduce_ref(a.float() @ b.float(), group)
    return _rel_err(out, _ref_epilogue(spec, full.chunk(ws)[r], [residual]))


def _ar_case(group, dtype, device, lowering, m, k, n, spec):
    a = _randn(m, k, dtype=dtype, device=device)
    b = _randn(k, n, dtype=dtype, device=device, scale=k**-0.5)
    residual = _randn(m, n, dtype=dtype, device=device)
    _poison(device)
    out = torch.ops.overlap.mm_ar(a, b, None, "sum", group.group_name, lowering, spec, [residual])
    return _rel_err(out, _ref_epilogue(spec, _all_reduce_ref(a.float() @ b.float(), group), [residual]))


def _cases(ws):
    """Shapes the symm kernels take (16-byte rows; tiles not filled)."""
    return [
        ("ag_mm bias+gelu | plain", _ag_case, dict(rows=37, k=136, ns=(200, 72), spec="bias:0,gelu|", n_args=1)),
        ("ag_mm gelu_tanh,mul", _ag_case, dict(rows=64, k=64, ns=(96,), spec="gelu_tanh,mul:0.5", n_args=0)),
        ("ag_mm swiglu", _ag_case, dict(rows=100, k=128, ns=(144, 144), spec="swiglu:1|", n_args=0)),
        ("ag_mm residual add", _ag_case, dict(rows=512, k=256, ns=(384,), spec="add:1", n_args=2)),
        ("mm_rs residual add", _rs_case, dict(rows=45, k=72, n=136, spec="add:0")),
        ("mm_rs scale,add,gelu", _rs_case, dict(rows=1000, k=256, n=264, spec="mul:0.5,add:0,gelu")),
        ("mm_rs add,cast fp32", _rs_case, dict(rows=64, k=64, n=96, spec="add:0,cast:float32")),
        # long K: the cuBLAS path (transport ce), the epilogue in its reducing kernel
        ("mm_rs cuBLAS add,gelu", _rs_case, dict(rows=1024, k=2048, n=264, spec="add:0,gelu")),
        ("mm_ar one-shot add,silu", _ar_case, dict(m=91, k=64, n=152, spec="add:0,silu")),
        ("mm_ar rounds add", _ar_case, dict(m=2100, k=136, n=1032, spec="add:0")),
    ]


def ops_worker(rank: int, ws: int, device: str, lowering: str):
    import torch.distributed as dist

    cache = tempfile.mkdtemp(prefix=f"overlap_gpu_ep_r{rank}_")
    os.environ["XDG_CACHE_HOME"] = cache  # generated epilogues of this run
    _setup_rank(rank, device)
    from overlap_backend.spec import knobs

    lowering = _use_lowering(lowering)
    group = dist.group.WORLD
    bad, results = [], []
    for dtype in DTYPES:
        for label, case, kw in _cases(ws):
            before = _paths()
            err = case(group, dtype, device, lowering, **kw)
            after = _paths()
            took = sorted(k for k in after if after[k] != before.get(k, 0))
            results.append((f"{label} [{','.join(took) or lowering}]", str(dtype), err))
            if lowering == "symm" and not any(":symm" in t or ":oneshot" in t for t in took):
                bad.append(f"rank {rank}: {label} {dtype}: did not run on the symm kernels ({took})")
            if (lowering == "symm" and "cuBLAS" in label and knobs.symm.TRANSPORT == "ce"
                    and "mm_rs:symm:cublas" not in took):
                bad.append(f"rank {rank}: {label} {dtype}: did not take the cuBLAS path ({took})")
            if not err <= _tol(dtype):
                bad.append(f"rank {rank}: {label} {dtype}: rel err {err:.3e} > {_tol(dtype):g}")
    assert not bad, "\n".join(bad)
    return results


def _block_sizes(ws: int) -> tuple[int, int, int]:
    """(hidden, heads, ffn) of the demo block here: heads and ffn are split over the ranks, and each
    rank's Q/K/V columns (heads/ws * head_dim) must be rows of 16 bytes for the symm kernels. 4 heads
    of 24 up to 4 ranks (as measured on 2 GPUs); 8 GPUs: 8 heads of 16 (4 heads leave ranks none)."""
    return (96, 4, 192) if ws <= 4 else (128, 8, 256)


def compiled_worker(rank: int, ws: int, device: str, lowering: str):
    import overlap_backend
    from overlap_backend.models import TPBlock, TPSwiGLUMlp

    cache = tempfile.mkdtemp(prefix=f"overlap_gpu_ep_c{rank}_")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache, "inductor")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")
    os.environ["XDG_CACHE_HOME"] = cache
    _setup_rank(rank, device)
    dtype = torch.bfloat16
    seq = 64  # per rank: the reduce-scatter's runs of rows fit a block height (symm)
    # built afresh for each variant (a model holding a process group cannot be deep-copied); the
    # seed makes the weights identical
    hidden, heads, ffn = _block_sizes(ws)
    models = {
        "tp_block": (hidden, lambda: TPBlock(hidden, heads, ffn, dtype=dtype, device=device, seed=0)
                     .requires_grad_(False)),
        "swiglu_mlp": (96, lambda: TPSwiGLUMlp(96, 256, dtype=dtype, device=device, seed=0).requires_grad_(False)),
    }
    out, bad = {}, []
    for name, (width, build) in models.items():
        x = _randn(2, seq, width, dtype=dtype, device=device)
        with torch.no_grad():
            ref = build()(x)
            for fuse in (False, True):
                torch._dynamo.reset()
                backend = overlap_backend.make_backend(lowering=lowering if lowering != "symm-peer" else "symm",
                                                       inductor=True, fuse_epilogues=fuse)
                got = torch.compile(build(), backend=backend)(x)
                err = _rel_err(got, ref)
                specs = [e["spec"] for r in backend.reports for m in r.matches if m.epilogue for e in m.epilogue]
                out[f"{name} fuse={fuse}"] = (err, specs)
                if not err <= _tol(dtype):
                    bad.append(f"rank {rank}: {name} fuse={fuse}: rel err {err:.3e} vs eager")
                if fuse and not any(specs):
                    bad.append(f"rank {rank}: {name}: nothing captured ({specs})")
    out["paths"] = _paths()
    assert not bad, "\n".join(bad)
    return out


@LOWERINGS
@WORLD_SIZES
@pytest.mark.timeout(300)
def test_ops_with_epilogues_numerics(ws, lowering):
    _need_gpus(ws, lowering)
    worst: dict[tuple[str, str], float] = {}
    for per_rank in _run(ops_worker, ws, lowering, timeout=280):
        for label, dtype, err in per_rank:
            worst[(label, dtype)] = max(worst.get((label, dtype), 0.0), err)
    for (label, dtype), err in worst.items():
        print(f"ws={ws} {lowering} {label} {dtype}: max rel err {err:.2e}")


@pytest.mark.parametrize("lowering", ["p2p", "symm"])
@WORLD_SIZES
@pytest.mark.timeout(400)
def test_compiled_blocks_fused_vs_eager(ws, lowering):
    _need_gpus(ws, lowering, eager_all_gather=True)
    env = {"OVERLAP_INDUCTOR": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    results = _run(compiled_worker, ws, lowering, timeout=380, env=env)
    for name, res in results[0].items():
        print(f"ws={ws} {lowering} {name}: {res}")
    for r in results[1:]:
        for name in r:
            if name != "paths":
                assert r[name][1] == results[0][name][1], f"{name}: ranks captured different epilogues"


def prologue_worker(rank: int, ws: int, device: str, lowering: str):
    """The prologue hoist (passes/prologue.py) compiled with Inductor: RMSNorm after a sequence
    gather feeding Q/K/V, a float32 gather cast to bfloat16 for the GEMM, LayerNorm with weight and
    bias before a biased linear; each rank's own weights; against eager."""
    import torch.distributed as dist
    import torch.nn.functional as F

    import overlap_backend

    cache = tempfile.mkdtemp(prefix=f"overlap_gpu_pro_{rank}_")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache, "inductor")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")
    _setup_rank(rank, device)
    group = dist.group.WORLD
    # the models' choice: torch 2.11's all_gather_tensor breaks the graph for a gather dim other than 0
    # (Dynamo skips its _maybe_view_chunk_cat); all_gather_tensor_autograd does not
    from overlap_backend.models.tp import all_gather
    bf = torch.bfloat16
    hidden, seq = 256, 64  # per rank
    nw = (1 + 0.1 * _randn(hidden, dtype=torch.float32, device=device)).to(bf)
    wq, wk, wv = (_randn(n, hidden, dtype=bf, device=device, scale=hidden**-0.5) for n in (256, 128, 128))
    wb = _randn(hidden, 192, dtype=bf, device=device, scale=hidden**-0.5)
    nb, bq = _randn(hidden, dtype=bf, device=device), _randn(256, dtype=bf, device=device)
    # each rank's own weights (column shards differ per rank): eager and compiled use the same ones

    def rms_qkv(gather):
        def f(x):
            h = F.rms_norm(gather(x, 1), (hidden,), nw, 1e-6)
            return F.linear(h, wq), F.linear(h, wk), F.linear(h, wv)
        return f

    def cast(gather):
        def f(x):
            return gather(x, 0).to(bf) @ wb
        return f

    def ln_affine(gather):  # LayerNorm's weight and bias fold into the matmul's weight and bias
        def f(x):
            return F.linear(F.layer_norm(gather(x, 0), (hidden,), nw, nb), wq, bq)
        return f

    def compiled_gather(x, dim):
        return all_gather(x, dim, group)

    def eager_gather(x, dim):  # the group's collective (on the CPU under OVERLAP_TEST_SHARED_GPU's gloo)
        return _gather_ref(x, dim, group)

    cases = {"rms_qkv": (rms_qkv, _randn(2, seq, hidden, dtype=bf, device=device)),
             "cast": (cast, _randn(2 * seq, hidden, dtype=torch.float32, device=device)),
             "ln_affine": (ln_affine, _randn(2 * seq, hidden, dtype=bf, device=device))}
    out, bad = {}, []
    for name, (fn, x) in cases.items():
        torch._dynamo.reset()
        with torch.no_grad():
            ref = fn(eager_gather)(x)
            # cost model off: these small layers are about numerics, the rewrite must happen
            backend = overlap_backend.make_backend(lowering=_use_lowering(lowering), inductor=True, cost_model="off")
            _poison(device)
            # fullgraph: a graph break would run funcol's gather eagerly (gloo's, on CUDA tensors,
            # segfaults under OVERLAP_TEST_SHARED_GPU with torch 2.11)
            got = torch.compile(fn(compiled_gather), backend=backend, fullgraph=True)(x)
        got, ref = (got, ref) if isinstance(got, tuple) else ((got,), (ref,))
        err = max(_rel_err(g, r) for g, r in zip(got, ref))
        moved = [m.prologue["moved_before_gather"] for r in backend.reports for m in r.matches
                 if m.applied and m.prologue]
        out[name] = (err, moved)
        if not err <= _tol(bf):
            bad.append(f"rank {rank}: {name}: rel err {err:.3e} vs eager")
        if len(moved) != 1:
            bad.append(f"rank {rank}: {name}: {len(moved)} ag_mm ops took a prologue")
    out["paths"] = _paths()
    if lowering.startswith("symm") and not out["paths"].get("ag_mm:symm"):
        bad.append(f"rank {rank}: ag_mm never ran on the symm kernels: {out['paths']}")
    assert not bad, "\n".join(bad)
    return out


@pytest.mark.parametrize("lowering", ["p2p", "symm"])
@WORLD_SIZES
@pytest.mark.timeout(400)
def test_compiled_prologues_vs_eager(ws, lowering):
    _need_gpus(ws, lowering)  # the reference gathers through _gather_ref (runs under OVERLAP_TEST_SHARED_GPU)
    env = {"OVERLAP_INDUCTOR": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    for rank, res in enumerate(_run(prologue_worker, ws, lowering, timeout=380, env=env)):
        print(f"ws={ws} {lowering} rank {rank}: {res}")


def apart_worker(rank: int, ws: int, device: str, ratio_dir: str):
    """The ``ag_mm`` cases of ``_cases`` with a ratio file that measured the kernel plain with the epilogue after
    it faster than fused (``apart_ratio``): each must take ``ag_mm:symm:triton-epilogue-apart`` and meet the
    float32 reference in every dtype."""
    import torch.distributed as dist

    _setup_rank(rank, device)
    from overlap_backend.spec import kernel_ratios, knobs

    group = dist.group.WORLD
    cases = [c for c in _cases(ws) if c[1] is _ag_case]
    entries = [{"gpu": kernel_ratios.gpu_name(), "kernel": "ag_mm", "dtype": kernel_ratios.dtype_name(dtype),
                "ws": ws, "M": ws * kw["rows"], "K": kw["k"], "N": sum(kw["ns"]), "fused": True, "ratio": 1.2,
                "apart_ratio": 1.0} for _, _, kw in cases for dtype in DTYPES]
    path = Path(ratio_dir) / f"ratios_rank{rank}.json"
    path.write_text(json.dumps(kernel_ratios.document(entries)))
    knobs.symm.set(KERNEL_RATIOS_FILE=str(path), AG_MM_GEMM="triton")
    kernel_ratios.forget()
    bad, results = [], []
    for dtype in DTYPES:
        for label, case, kw in cases:
            before = _paths().get("ag_mm:symm:triton-epilogue-apart", 0)
            err = case(group, dtype, device, "symm", **kw)
            took = _paths().get("ag_mm:symm:triton-epilogue-apart", 0) - before
            results.append((label, str(dtype), err))
            if took != 1:
                bad.append(f"rank {rank}: {label} {dtype}: the epilogue-apart path ran {took} times, not once")
            if not err <= _tol(dtype):
                bad.append(f"rank {rank}: {label} {dtype}: rel err {err:.3e} > {_tol(dtype):g}")
    assert not bad, "\n".join(bad)
    return results


@pytest.mark.timeout(300)
def test_ag_mm_epilogue_apart_numerics(tmp_path):
    _need_gpus(2, "symm")
    for per_rank in _run(apart_worker, 2, str(tmp_path), timeout=280):
        for label, dtype, err in per_rank:
            print(f"ws=2 symm epilogue apart: {label} {dtype}: rel err {err:.2e}")
