"""Epilogues: the spec, the generated Triton code, the captures, numerics against eager.

- spec parsing and the ops' checks: clear errors naming the bad step;
- every supported step (and chains of them) through the generated Triton code under
  ``TRITON_INTERPRET=1``: the pointwise kernel, the symm ``ag_mm`` kernel's store path and the symm
  ``mm_rs`` kernel's own-chunk epilogue (flags pre-set as in test_tile_kernels.py), against a float32
  reference of the same steps on fresh random inputs, outputs poisoned with NaN first;
- the cache: memory, then disk (a second process generates nothing);
- exact graphs on the fake group: what each pass captures, what it leaves and why;
- compiled vs eager on 2 gloo ranks: the demo block (GELU, biases, residual adds), SwiGLU, a
  residual + scale + cast after mm_ar, and an activation the codegen does not support (stays in the
  graph).

The interpreter rounds float32 to bfloat16 by truncation (the GPU rounds to nearest), so the bf16
kernel checks use the bf16 tolerance (relative error <= 1e-2, docs/architecture.md) against a float32
reference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

from overlap_backend import make_backend
from overlap_backend.spec import epilogue as spec_mod

all_gather = getattr(funcol, "all_gather_single", funcol.all_gather_tensor)
reduce_scatter = getattr(funcol, "reduce_scatter_single", funcol.reduce_scatter_tensor)
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(not INTERPRET, reason="Triton interpreter tests (CPU); GPU: tests/gpu/test_gpu.py")

# every step of the closed set, alone and chained; "#" marks the tensors each reads
SPECS = [
    "bias:0", "add:1", "gelu", "gelu_tanh", "silu", "swiglu:0", "mul:0.125", "mul:-3.0",
    "cast:float32,gelu,cast:{dt}", "bias:0,gelu", "bias:0,silu,mul:2.0,add:1", "add:1,cast:float32",
]
TOL = {torch.float32: 1e-4, torch.bfloat16: 1e-2}


def _rel(a, b):
    a, b = a.double(), b.double()
    assert not torch.isnan(a).any(), "NaN in the output"
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _spec(spec, dtype):
    return spec.replace("{dt}", spec_mod.DTYPE_NAMES[dtype])


def _ref(spec, x, args, outs=()):
    """The steps in float32 on the (already rounded) values: the reference the kernels must meet."""
    steps = [s for s in spec_mod.parse(spec) if s.kind != "cast"]
    return spec_mod.apply(spec_mod.format_spec(steps), x.float(), [a.float() for a in args], [o.float() if o is not None else None for o in outs])


# ----------------------------------------------------------------------------- the spec itself
@pytest.mark.parametrize("spec, msg", [
    ("relu", "unknown step 'relu'"),
    ("bias", "step 'bias' needs an index"),
    ("gelu:tanh", "takes no parameter"),
    ("mul:abc", "mul needs a float"),
    ("mul:inf", "not finite"),
    ("cast:int8", "cast to 'int8'"),
    ("gelu,,silu", "empty step"),
])
def test_bad_spec_names_the_step(spec, msg):
    with pytest.raises(spec_mod.EpilogueError, match=msg):
        spec_mod.parse(spec)


def test_spec_round_trip_and_dtypes():
    steps = spec_mod.parse("bias:0,gelu_tanh,mul:0.5,add:1,cast:bfloat16,swiglu:2")
    assert spec_mod.format_spec(steps) == "bias:0,gelu_tanh,mul:0.5,add:1,cast:bfloat16,swiglu:2"
    assert spec_mod.out_dtype("gelu,cast:bfloat16", torch.float32) == torch.bfloat16
    assert spec_mod.split_outputs("gelu||bias:0", 3) == ["gelu", "", "bias:0"]
    with pytest.raises(spec_mod.EpilogueError, match="2 '|'-separated specs for 3 outputs"):
        spec_mod.split_outputs("gelu|", 3)


def test_op_checks_epilogue_args(fake_pg):
    a, b = torch.randn(8, 4), torch.randn(4, 6)
    with pytest.raises(spec_mod.EpilogueError, match="add:0 has shape"):
        torch.ops.overlap.mm_ar(a, b, None, "sum", fake_pg.group_name, "p2p", "add:0", [torch.randn(8, 5)])
    with pytest.raises(spec_mod.EpilogueError, match="epilogue_args has 0 tensors"):
        torch.ops.overlap.mm_ar(a, b, None, "sum", fake_pg.group_name, "p2p", "bias:0", [])
    with pytest.raises(spec_mod.EpilogueError, match="is torch.bfloat16, the value is torch.float32"):
        torch.ops.overlap.mm_ar(a, b, None, "sum", fake_pg.group_name, "p2p", "bias:0", [torch.randn(6).bfloat16()])
    with pytest.raises(spec_mod.EpilogueError, match="only ag_mm has several"):
        torch.ops.overlap.mm_ar(a, b, None, "sum", fake_pg.group_name, "p2p", "swiglu:0", [])
    # the fake implementation gives the epilogue's dtype
    from torch._subclasses import FakeTensorMode

    with FakeTensorMode() as mode:
        fa, fb = mode.from_tensor(a), mode.from_tensor(b)
        out = torch.ops.overlap.mm_ar(fa, fb, None, "sum", fake_pg.group_name, "p2p", "gelu,cast:bfloat16")
        assert out.dtype == torch.bfloat16 and out.shape == (8, 6)


# ------------------------------------------------------------------- generated code: pointwise
@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("spec", SPECS)
def test_generated_pointwise_matches_reference(spec, dtype, tmp_path, monkeypatch):
    from overlap_backend.codegen import epilogue as gen

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    spec = _spec(spec, dtype)
    M, N = 37, 24  # not multiples of the block
    x = torch.randn(M, N).to(dtype)
    args = [torch.randn(N).to(dtype), torch.randn(M, N).to(dtype)]
    other = torch.randn(M, N).to(dtype)
    g = gen.build(spec, dtype)
    out = torch.full((M, N), float("nan"), dtype=spec_mod.out_dtype(spec, dtype))
    gen.apply_pointwise(g, x, args, [other], out=out)
    assert out.dtype == spec_mod.apply(spec, x, args, [other]).dtype
    assert _rel(out, _ref(spec, x, args, [other])) <= TOL[dtype]


@needs_interpreter
def test_generated_source_is_cached_in_memory_and_on_disk(tmp_path, monkeypatch):
    from overlap_backend.codegen import epilogue as gen

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("OVERLAP_CACHE_DIR", raising=False)  # the root under test is XDG's
    monkeypatch.setattr(gen, "_memory", {})
    monkeypatch.setattr(gen, "_built", {})
    gen.reset_stats()
    a = gen.build("bias:0,gelu", torch.bfloat16)
    assert gen.build("bias:0,gelu", torch.bfloat16) is a
    assert gen.STATS == {"generated": 1, "memory_hits": 1, "disk_hits": 0}
    assert a.path.parent == tmp_path / "overlap_backend" / "kernels" and a.path.read_text() == a.source
    # a second process finds the file and generates nothing
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "TRITON_INTERPRET": "1"}
    script = ("import torch; from overlap_backend.codegen import epilogue as g;"
              "a = g.build('bias:0,gelu', torch.bfloat16); print(a.path); print(dict(g.STATS))")
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    path, stats = r.stdout.strip().splitlines()
    assert path == str(a.path)
    assert "'generated': 0" in stats and "'disk_hits': 1" in stats, "a second process must not generate again"


def test_cache_key_covers_versions_and_device(monkeypatch):
    from overlap_backend.codegen import epilogue as gen

    src, slots = gen.emit("bias:0,swiglu:2,add:1", torch.float16)
    assert slots == (("arg", 0), ("out", 2), ("arg", 1))
    key = gen.cache_key(src)
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    assert gen.cache_key(src) != key
    monkeypatch.setattr(gen, "_device_name", lambda: "NVIDIA H200")
    assert gen.cache_key(src) != key
    with pytest.raises(gen.Unsupported, match="more than 4 tensors"):
        gen.emit("add:0,add:1,add:2,add:3,add:4", torch.float32)
    with pytest.raises(gen.Unsupported, match="float64"):
        gen.emit("gelu", torch.float64)


# --------------------------------------------------------------- generated code in the symm kernels
CFG = (16, 16, 16, 2, 1, 1, False)
BAND, EPOCH = 16, 3
KERNEL_SPECS = ["bias:0,gelu", "gelu_tanh", "silu,mul:0.5", "swiglu:1", "add:1,cast:float32"]


@pytest.fixture
def _cpu_allocator(tmp_path, monkeypatch):
    import triton

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8))


def _status():
    return torch.zeros(1, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)


@needs_interpreter
@pytest.mark.parametrize("spec", KERNEL_SPECS)
def test_ag_mm_kernel_with_generated_epilogue(spec, _cpu_allocator):
    from overlap_backend.codegen import ag_mm
    from overlap_backend.codegen import epilogue as gen

    ws, r, outer, run, K, N = 3, 1, 2, 7, 16, 24  # [B, S, K] gathered along S: runs of 7 rows
    rows = outer * run
    shards = [torch.randn(outer, run, K) for _ in range(ws)]
    G = torch.cat(shards, dim=1).reshape(-1, K)
    w, bias = torch.randn(N, K).t(), torch.randn(N)  # an nn.Linear weight, K-major
    args = [torch.randn(N), torch.randn(ws * rows, N)]
    up = torch.randn(ws * rows, N)  # swiglu:1 reads output 1, already computed
    buf = torch.stack([s.reshape(rows, K) for s in shards])
    buf[r] = float("nan")
    out = torch.full((ws * rows, N), float("nan"))
    g = gen.build(spec, torch.float32)
    ag_mm.launch(shards[r].reshape(rows, K).contiguous(), buf, w, bias, out,
                 torch.full((ws * 1,), EPOCH, dtype=torch.int32), EPOCH, _status(), 10**6, r, ws, run, BAND, CFG, 3,
                 timed=False, epilogue=g, ep_ptrs=gen.pointers(g, args, [None, up]))
    ref = _ref(spec, G @ w + bias, args, [None, up])
    assert _rel(out, ref) <= 1e-4


@needs_interpreter
@pytest.mark.parametrize("spec", ["add:0", "add:0,mul:0.5,gelu", "bias:1,silu"])
def test_mm_rs_kernel_own_chunk_epilogue(spec, _cpu_allocator):
    from overlap_backend.codegen import epilogue as gen
    from overlap_backend.codegen import mm_rs

    ws, r, rows, K, N = 2, 1, 20, 16, 24
    M = ws * rows
    A = [torch.randn(M, K) for _ in range(ws)]
    B = [torch.randn(K, N) for _ in range(ws)]
    C = [a @ b for a, b in zip(A, B)]
    recv = torch.full((ws * rows, N), float("nan"))
    recv[(1 - r) * rows:(2 - r) * rows] = C[1 - r][r * rows:(r + 1) * rows]
    stage = torch.full((ws * rows, N), float("nan"))
    out = torch.full((rows, N), float("nan"))
    nb = -(-rows // BAND)
    args = [torch.randn(rows, N), torch.randn(N)]  # the residual: this rank's row chunk
    g = gen.build(spec, torch.float32)
    mm_rs.launch(A[r], B[r], None, stage, recv, None, out, torch.zeros(ws * nb, dtype=torch.int32),
                 torch.zeros(ws * nb, dtype=torch.int32), torch.full((ws * nb,), EPOCH, dtype=torch.int32),
                 torch.zeros(1, dtype=torch.int32), EPOCH, _status(), 10**6, r, ws, rows, rows, 1, 0, 0, False, BAND,
                 CFG, 4, timed=False, epilogue=g, ep_ptrs=gen.pointers(g, args))
    reduced = sum(c[r * rows:(r + 1) * rows] for c in C)
    assert _rel(out, _ref(spec, reduced, args)) <= 1e-4
    # partials shipped to the other rank are the plain GEMM (the epilogue runs after the reduction)
    torch.testing.assert_close(stage[(1 - r) * rows:(2 - r) * rows], C[r][(1 - r) * rows:(2 - r) * rows])


@needs_interpreter
@pytest.mark.parametrize("spec", ["add:0,silu", "mul:0.5,bias:1,cast:float32"])
def test_mm_ar_oneshot_sum_kernel_epilogue(spec, _cpu_allocator):
    """mm_ar one-shot: every rank sums every partial, the epilogue runs in that kernel."""
    from overlap_backend.codegen import epilogue as gen
    from overlap_backend.codegen import reduce

    ws, r, M, N = 3, 1, 9, 40
    parts = [torch.randn(M, N) for _ in range(ws)]
    recv = torch.cat(parts)
    recv[r * M:(r + 1) * M] = float("nan")
    out = torch.full((M, N), float("nan"))
    args = [torch.randn(M, N), torch.randn(N)]
    g = gen.build(spec, torch.float32)
    reduce.launch(parts[r], recv, out, torch.full((ws,), EPOCH, dtype=torch.int32), EPOCH, _status(), 10**6,
                  r, ws, False, timed=False, epilogue=g, ep_ptrs=gen.pointers(g, args))
    assert _rel(out, _ref(spec, sum(parts), args)) <= 1e-4


# ------------------------------------------------------------------------- exact graphs (passes)
def _compile(fn, *args, **kw):
    backend = make_backend(inductor=False, **kw)
    out = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return backend, out


def _op(graph, name):
    (node,) = [n for n in graph.nodes if n.target is getattr(torch.ops.overlap, name).default]
    return node


def _targets(graph):
    return {n.target for n in graph.nodes if n.op == "call_function"}


def _record(backend, pass_name):
    (rec,) = [m for r in backend.reports for m in r.matches if m.pass_name == pass_name]
    return rec


def test_ag_mm_captures_bias_gelu_and_swiglu(fake_pg, capture, clean_env):
    def f(x, w1, b1, wg, wu):
        g = all_gather(x, 1, fake_pg)
        h = F.gelu(F.linear(g, w1) + b1)  # bias add after the matmul, then GELU
        s = F.silu(g @ wg) * (g @ wu)  # SwiGLU of two outputs of the same gather
        return h, s

    x, w1, b1 = torch.randn(2, 3, 8), torch.randn(16, 8), torch.randn(16)
    wg, wu = torch.randn(8, 12), torch.randn(8, 12)
    be, _ = _compile(f, x, w1, b1, wg, wu)
    g = be.graphs[0]
    op = _op(g, "ag_mm")
    assert op.args[7] == "bias:0,gelu|swiglu:2|"
    assert op.args[8] == [op.args[8][0]] and op.args[8][0].name == "arg2_1"  # b1
    aten = torch.ops.aten
    for t in (aten.erf.default, aten.mul.Tensor, aten.add.Tensor, aten.exp.default, aten.div.Tensor):
        assert t not in _targets(g), f"{t} should have been captured:\n{g}"
    rec = _record(be, "ag_mm")
    assert [e["spec"] for e in rec.epilogue] == ["bias:0,gelu", "swiglu:2", ""]
    assert "is a graph output" in rec.epilogue[0]["left"]


def test_mm_rs_residual_scale_captured_but_not_a_shared_value(fake_pg, capture, clean_env):
    def f(a, w, x):
        y = reduce_scatter(a @ w, "sum", 0, fake_pg)
        h = x + 0.5 * y  # residual + scale: captured
        return h, h * 2  # h is read twice: the capture stops at h

    a, w, x = torch.randn(16, 8), torch.randn(8, 6), torch.randn(4, 6)
    be, _ = _compile(f, a, w, x)
    op = _op(be.graphs[0], "mm_rs")
    assert op.args[8:] == ("mul:0.5,add:0", [op.args[8 + 1][0]]) and op.args[9][0].name == "arg2_1"
    rec = _record(be, "mm_rs")
    assert rec.epilogue[0]["captured"] == ["mul", "add"]
    assert rec.epilogue[0]["left"].startswith("add has 2 users")
    mul_users = [n for n in be.graphs[0].nodes if n.target is torch.ops.aten.mul.Tensor]
    assert len(mul_users) == 1 and mul_users[0].args[0] is op  # h * 2 stays, reads the op


def test_mm_ar_residual_add_and_cast(fake_pg, capture, clean_env):
    def f(a, w, r):
        y = funcol.all_reduce((a @ w).view(2, 4, 6), "sum", fake_pg)
        return (y + r).to(torch.bfloat16)

    be, out = _compile(f, torch.randn(8, 5), torch.randn(5, 6), torch.randn(2, 4, 6))
    g = be.graphs[0]
    op = _op(g, "mm_ar")
    assert op.args[6] == "add:0,cast:bfloat16" and op.meta["val"].dtype == torch.bfloat16
    assert out.dtype == torch.bfloat16 and out.shape == (2, 4, 6)
    assert torch.ops.prims.convert_element_type.default not in _targets(g)


def test_widening_cast_is_left_with_its_consumer(fake_pg, capture, clean_env):
    """A bfloat16 mm_rs whose result is added to a residual, then cast to float32 (a loss in
    float32): the add is captured, the cast is not (the op would write, and ship, float32)."""
    def f(a, w, x):
        y = reduce_scatter(a @ w, "sum", 0, fake_pg)
        return (x + y).float().sum()

    bf = torch.bfloat16
    a, w, x = torch.randn(16, 8).to(bf), torch.randn(8, 6).to(bf), torch.randn(4, 6).to(bf)
    be, out = _compile(f, a, w, x)
    op = _op(be.graphs[0], "mm_rs")
    assert op.args[8] == "add:0" and op.meta["val"].dtype == bf
    rec = _record(be, "mm_rs")
    assert "widens torch.bfloat16 to torch.float32" in rec.epilogue[0]["left"]
    assert torch.ops.prims.convert_element_type.default in _targets(be.graphs[0])
    assert out.dtype == torch.float32  # (the fake group's collectives return no data: shapes only)


def test_unsupported_pointwise_is_left_and_reported(fake_pg, capture, clean_env, tmp_path):
    def f(a, w, r):
        y = funcol.all_reduce(a @ w, "sum", fake_pg)
        return torch.tanh(y + r)  # the add is captured, tanh is not a step

    be, _ = _compile(f, torch.randn(8, 5), torch.randn(5, 6), torch.randn(8, 6), debug_dir=str(tmp_path))
    g = be.graphs[0]
    op = _op(g, "mm_ar")
    assert op.args[6] == "add:0"
    (tanh,) = [n for n in g.nodes if n.target is torch.ops.aten.tanh.default]
    assert tanh.args[0] is op
    summary = json.loads((tmp_path / "rank1" / "summary.json").read_text())
    (m,) = [m for m in summary["graphs"][0]["matches"] if m["pass"] == "mm_ar"]
    assert m["epilogue"] == [{"output": 0, "spec": "add:0", "captured": ["add"],
                              "left": "tanh (aten.tanh.default) is not an epilogue step"}]
    # the dump: generated source and runtime calls, per op, readable as Python
    (ops_file,) = list((tmp_path / "rank1").glob("*/ops/mm_ar_default.py"))
    text = ops_file.read_text()
    compile(text, str(ops_file), "exec")
    assert "def epilogue_0(" in text and "@triton.jit" in text and "def mm_ar_calls():" in text
    assert "batch_isend_irecv" in text and "epilogue.apply('add:0'" in text


def test_fusion_off_leaves_the_graph_as_before(fake_pg, capture, clean_env):
    clean_env.setenv("OVERLAP_FUSE_EPILOGUES", "0")

    def f(a, w, r):
        return funcol.all_reduce(a @ w, "sum", fake_pg) + r

    be, _ = _compile(f, torch.randn(8, 5), torch.randn(5, 6), torch.randn(8, 6))
    op = _op(be.graphs[0], "mm_ar")
    assert len(op.args) == 6  # no epilogue arguments at all
    assert "OVERLAP_FUSE_EPILOGUES=0" in _record(be, "mm_ar").epilogue[0]["left"]


def test_fuse_epilogues_env_bad_value(clean_env):
    from overlap_backend import ConfigError, OverlapConfig

    clean_env.setenv("OVERLAP_FUSE_EPILOGUES", "sometimes")
    with pytest.raises(ConfigError, match="OVERLAP_FUSE_EPILOGUES='sometimes' is not a boolean"):
        OverlapConfig.from_env()
    clean_env.delenv("OVERLAP_FUSE_EPILOGUES")
    assert make_backend(fuse_epilogues=False).config.fuse_epilogues is False


def test_training_values_saved_for_backward_are_not_captured(fake_pg, capture, clean_env):
    def f(x, w1):
        return F.gelu(all_gather(x, 0, fake_pg) @ w1)

    x, w1 = torch.randn(4, 8, requires_grad=True), torch.randn(8, 16, requires_grad=True)
    be = make_backend(inductor=False)
    torch.compile(f, backend=be)(x, w1).sum().backward()
    fwd = [m for r in be.reports if r.kind == "forward" for m in r.matches if m.pass_name == "ag_mm"]
    assert fwd[0].epilogue[0]["spec"] == "" and "users" in fwd[0].epilogue[0]["left"]


# ---------------------------------------------------------------------- compiled vs eager, gloo
def numerics_worker(rank, ws):
    import torch
    import torch.distributed as dist

    import overlap_backend
    from overlap_backend.models import TPBlock, TPSwiGLUMlp

    group = dist.group.WORLD
    results = {}

    def case(name, fn, *inputs, tol=1e-4):
        torch._dynamo.reset()
        with torch.no_grad():
            ref = fn(*inputs)
            backend = overlap_backend.make_backend(lowering="p2p")
            got = torch.compile(fn, backend=backend)(*inputs)
        specs = [e["spec"] for r in backend.reports for m in r.matches if m.epilogue for e in m.epilogue]
        results[name] = (_rel(got, ref), tol, specs)

    block = TPBlock(hidden=32, heads=4, ffn=64, dtype=torch.float32, seed=0)
    x = torch.randn(2, 4 * ws, 32, generator=torch.Generator().manual_seed(1))
    case("tp_block", block, x.chunk(ws, dim=1)[rank].contiguous())
    mlp = TPSwiGLUMlp(hidden=32, ffn=64, seed=0)
    case("swiglu_mlp", mlp, torch.randn(2, 4 * ws, 32, generator=torch.Generator().manual_seed(2)).chunk(ws, 1)[rank])

    g = torch.Generator().manual_seed(3)
    w = torch.randn(16, 8 * ws, generator=g).chunk(ws, 1)[rank].contiguous()
    w2 = torch.randn(8 * ws, 16, generator=g).chunk(ws, 0)[rank].contiguous()
    a, r = torch.randn(6, 16, generator=g), torch.randn(6, 16, generator=g)

    def two_all_reduces(a, r):
        # residual + scale + casts: all captured; sigmoid: no epilogue step, it and what follows stay
        y1 = (r + 0.25 * funcol.all_reduce(torch.tanh(a @ w) @ w2, "sum", group)).to(torch.bfloat16).float()
        y2 = torch.sigmoid(funcol.all_reduce(a @ w, "sum", group) @ w2) + r
        return torch.cat([y1, y2])

    case("two_all_reduces", two_all_reduces, a, r, tol=1e-2)
    return results


@pytest.mark.timeout(300)
def test_compiled_fused_epilogues_match_eager_on_gloo(clean_env):
    from dist_harness import run_ranks

    per_rank = run_ranks(numerics_worker, 2, timeout=280)
    for rank, res in enumerate(per_rank):
        for name, (err, tol, specs) in res.items():
            assert err <= tol, f"rank {rank} {name}: rel err {err} > {tol} (epilogues {specs})"
            assert specs == per_rank[0][name][2], "every rank captures the same epilogues"
    specs = {name: r[2] for name, r in per_rank[0].items()}
    # demo block: q/v biases, fc1's GELU, both residual adds; SwiGLU of the gate/up outputs
    assert specs["tp_block"] == ["bias:0", "", "bias:1", "gelu", "add:0", "add:0"]
    assert specs["swiglu_mlp"] == ["swiglu:1", "", "add:0"]
    # the second all-reduce: sigmoid stays in the graph, and so does the add after it
    assert specs["two_all_reduces"] == ["mul:0.25,add:0,cast:bfloat16,cast:float32", ""]


def inductor_worker(rank, ws):
    import torch

    import overlap_backend
    from overlap_backend.models import TPBlock

    block = TPBlock(hidden=32, heads=4, ffn=64, dtype=torch.bfloat16, seed=0)
    x = torch.randn(2, 4 * ws, 32, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    x = x.chunk(ws, 1)[rank].contiguous()
    with torch.no_grad():
        ref = block(x)
        backend = overlap_backend.make_backend(inductor=True, lowering="p2p")
        got = torch.compile(block, backend=backend)(x)
    return _rel(got, ref), [e["spec"] for r in backend.reports for m in r.matches if m.epilogue for e in m.epilogue]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_inductor_demo_block_bf16_fused_matches_eager(clean_env):
    """The one Inductor end-to-end test: the ops with epilogue arguments as Inductor fallback kernels."""
    from dist_harness import run_ranks

    per_rank = run_ranks(inductor_worker, 2, timeout=550, env={"OVERLAP_INDUCTOR": "1"})
    for err, specs in per_rank:
        assert err <= 1e-2, err
        assert specs == ["bias:0", "", "bias:1", "gelu", "add:0", "add:0"]


def test_bench_counts_kernel_launches_from_profiler_events():
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bench.suites.bench_epilogue import count_launches, parse_args, variants

    ev = [SimpleNamespace(name=n, device_type=d) for n, d in [
        ("triton_poi_fused_add_0", DeviceType.CUDA), ("ag_mm_kernel", DeviceType.CUDA),
        ("Memcpy DtoD (Device -> Device)", DeviceType.CUDA), ("cuLaunchKernelEx", DeviceType.CPU),
        ("cudaLaunchKernel", DeviceType.CPU), ("aten::mm", DeviceType.CPU)]]
    assert count_launches(ev) == {"kernels": 2, "copies": 1, "launch_calls": 2}
    args = parse_args(["--out-dir", "x", "--device", "cpu", "--lowerings", "p2p,symm"])
    assert [v for v, _ in variants(args)] == ["inductor", "p2p_unfused", "p2p_fused", "symm_unfused", "symm_fused"]
    assert args.steps >= 30


def test_gpu_epilogue_tests_import():
    import importlib

    mod = importlib.import_module("test_gpu_epilogues")
    assert len(mod._cases(2)) == 10 and callable(mod.ops_worker) and callable(mod.compiled_worker)


def test_fusion_auto_captures_on_cpu_only(clean_env):
    """OVERLAP_FUSE_EPILOGUES=auto (the default): captured after a CPU GEMM, left to Inductor after a
    CUDA one (the fused kernels measured slower on 2×H200); 1 / 0 force it either way."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from overlap_backend import OverlapConfig
    from overlap_backend.passes.epilogue import fusion_off

    with FakeTensorMode():
        on_cuda = torch.empty(4, 8, device="cuda")
    on_cpu = torch.empty(4, 8)
    assert OverlapConfig.from_env().fuse_epilogues == "auto"
    assert fusion_off("auto", on_cpu) is None
    assert "off on CUDA by default" in fusion_off("auto", on_cuda)
    assert fusion_off(True, on_cuda) is None
    assert "OVERLAP_FUSE_EPILOGUES=0" in fusion_off(False, on_cpu)
    clean_env.setenv("OVERLAP_FUSE_EPILOGUES", "auto")
    assert OverlapConfig.from_env().fuse_epilogues == "auto"
    clean_env.setenv("OVERLAP_FUSE_EPILOGUES", "1")
    assert OverlapConfig.from_env().fuse_epilogues is True
