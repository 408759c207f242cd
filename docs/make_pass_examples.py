"""Regenerate the before/after graph excerpts of docs/passes.md from real dumps.

    python docs/make_pass_examples.py            # rewrite the generated blocks of docs/passes.md
    python docs/make_pass_examples.py --check    # exit 1 if any block is out of date
    python docs/make_pass_examples.py --list     # the example names
    python docs/make_pass_examples.py --print ag_mm_dim0   # print a block, write nothing

Every example compiles a small function with ``make_backend(inductor=False, debug_dir=...)`` on the
fake process group (``init_process_group("fake", ..., rank=0, world_size=2)``: ws = 2, group name
``'0'``, nothing communicated), reads the files the dump wrote (``00_before.py``,
``NN_after_<pass>.py``, ``NN_<pass>.diff``, ``summary.json``, see docs/debugging.md) and puts an
excerpt between the markers

    <!-- BEGIN GENERATED <name> (docs/make_pass_examples.py) -->
    ...
    <!-- END GENERATED <name> -->

in docs/passes.md. Nothing between the markers is written by hand. CPU only, about a minute.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PASSES_MD = ROOT / "docs" / "passes.md"
BEGIN = "<!-- BEGIN GENERATED {name} (docs/make_pass_examples.py) -->"
END = "<!-- END GENERATED {name} -->"


@dataclass
class Example:
    name: str
    build: object  # () -> (callable, args, backend overrides, train: bool)
    show: tuple  # what to print: ("before_after", pass) | ("diff", pass) | ("changes", pass) | ("json", pass)
    graph: str = "first"  # which graph's dump: "first", "forward", "backward", "inference"


# ---------------------------------------------------------------------------------- the examples
def _funcol():
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    return funcol, dist.group.WORLD


def ag_mm_dim0():
    import torch

    funcol, pg = _funcol()

    def f(x, w):
        return funcol.all_gather_tensor(x, 0, pg) @ w

    return f, (torch.randn(8, 16), torch.randn(16, 32)), {}, False


def ag_mm_qkv():
    import torch
    import torch.nn.functional as F

    funcol, pg = _funcol()

    def f(x, wq, wk, wv, bq):  # x: [2, 3, 16], w*: [24, 16], bq: [24]
        g = funcol.all_gather_tensor(x, 1, pg)
        return F.linear(g, wq, bq), g @ wk.t(), g @ wv.t()

    args = (torch.randn(2, 3, 16), torch.randn(24, 16), torch.randn(24, 16), torch.randn(24, 16), torch.randn(24))
    return f, args, {"fuse_epilogues": False}, False


def ag_mm_contraction():
    import torch

    funcol, pg = _funcol()

    def f(x, w):
        return funcol.all_gather_tensor(x, 1, pg) @ w

    return f, (torch.randn(8, 4), torch.randn(8, 32)), {}, False


def sp_mlp_training():
    """Sequence-parallel MLP: gather along the sequence dim, two matmuls, reduce-scatter back."""
    import torch

    funcol, pg = _funcol()

    def f(x, w1, w2):  # x: [2, 4, 16] (this rank's half of the sequence), w1: [16, 32], w2: [32, 16]
        g = funcol.all_gather_tensor_autograd(x, 1, pg)
        y = torch.relu(g @ w1) @ w2
        return funcol.reduce_scatter_tensor_autograd(y, "sum", 1, pg)

    args = (torch.randn(2, 4, 16, requires_grad=True), torch.randn(16, 32, requires_grad=True),
            torch.randn(32, 16, requires_grad=True))
    return f, args, {"fuse_epilogues": False}, True


def mm_rs_dim0():
    import torch

    funcol, pg = _funcol()

    def f(a, b):
        return funcol.reduce_scatter_tensor(a @ b, "sum", 0, pg)

    return f, (torch.randn(16, 8), torch.randn(8, 32)), {}, False


def mm_rs_sp_bias():
    import torch
    import torch.nn.functional as F

    funcol, pg = _funcol()

    def f(x, w, b):  # x: [2, 8, 16], w: [12, 16], b: [12]
        return funcol.reduce_scatter_tensor(F.linear(x, w, b), "avg", 1, pg)

    return f, (torch.randn(2, 8, 16), torch.randn(12, 16), torch.randn(12)), {}, False


def mm_ar_3d():
    import torch

    funcol, pg = _funcol()

    def f(x, w):  # x: [2, 5, 16], w: [16, 8]
        return funcol.all_reduce(x @ w, "sum", pg)

    return f, (torch.randn(2, 5, 16), torch.randn(16, 8)), {}, False


def mm_ar_inplace():
    import torch
    import torch.distributed as dist

    def f(a, b):
        y = a @ b
        dist.all_reduce(y)
        return y

    return f, (torch.randn(6, 16), torch.randn(16, 8)), {}, False


def epilogue_chain():
    """A bias + GELU after a gathered matmul, a residual add after a reduce-scatter (inference)."""
    import torch
    import torch.nn.functional as F

    funcol, pg = _funcol()

    def f(x, w1, b1, w2, residual):  # x: [4, 16], w1: [16, 32], b1: [32], w2: [32, 16], residual: [4, 16]
        h = F.gelu(funcol.all_gather_tensor(x, 0, pg) @ w1 + b1)
        return funcol.reduce_scatter_tensor(h @ w2, "sum", 0, pg) + residual

    args = (torch.randn(4, 16), torch.randn(16, 32), torch.randn(32), torch.randn(32, 16), torch.randn(4, 16))
    return f, args, {}, False


def cta_swiglu():
    import torch
    import torch.nn.functional as F

    funcol, pg = _funcol()

    def f(x, wg, wu, w2):  # x: [2, 3, 8], wg, wu: [16, 8], w2: [8, 16]
        return funcol.all_reduce(F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), w2), "sum", pg)

    args = (torch.randn(2, 3, 8), torch.randn(16, 8), torch.randn(16, 8), torch.randn(8, 16))
    return f, args, {"passes": ["cta_pipeline", "mm_ar"]}, False


def _moe(policy, form, train=False):
    """``MoELayer(8, 16, 4, top_k=2)``: 4 experts, two per rank; 4 tokens (capacity 2 per expert)."""
    import torch

    from overlap_backend.models.moe import MoELayer

    torch.manual_seed(0)
    layer = MoELayer(8, 16, 4, top_k=2, policy=policy, expert_form=form, capacity_factor=1.0)
    x = torch.randn(4, 8, requires_grad=train)
    return layer, (x,), {}, train


def moe_capacity_bmm():
    return _moe("capacity", "bmm")


def moe_dropless_grouped_mm():
    return _moe("dropless", "grouped_mm")


def moe_training():
    return _moe("capacity", "bmm", train=True)


EXAMPLES = [
    Example("ag_mm_dim0", ag_mm_dim0, ("before_after", "ag_mm")),
    Example("ag_mm_qkv", ag_mm_qkv, ("before_after", "ag_mm")),
    Example("ag_mm_contraction", ag_mm_contraction, ("diff", "ag_mm")),
    Example("ag_mm_backward", sp_mlp_training, ("diff", "ag_mm"), graph="backward"),
    Example("mm_rs_dim0", mm_rs_dim0, ("before_after", "mm_rs")),
    Example("mm_rs_sp_bias", mm_rs_sp_bias, ("diff", "mm_rs")),
    Example("mm_rs_backward", sp_mlp_training, ("diff", "mm_rs"), graph="backward"),
    Example("mm_ar_3d", mm_ar_3d, ("diff", "mm_ar")),
    Example("mm_ar_inplace", mm_ar_inplace, ("before_after", "mm_ar")),
    Example("epilogue_diff", epilogue_chain, ("diff", "ag_mm", "mm_rs")),
    Example("epilogue_json", epilogue_chain, ("json", "ag_mm", "mm_rs")),
    Example("cta_pipeline_swiglu", cta_swiglu, ("diff", "cta_pipeline")),
    Example("moe_capacity_bmm", moe_capacity_bmm, ("diff", "moe")),
    Example("moe_dropless_grouped_mm", moe_dropless_grouped_mm, ("changes", "moe")),
    Example("moe_training_forward", moe_training, ("changes", "moe"), graph="forward"),
    Example("moe_training_backward", moe_training, ("changes", "moe"), graph="backward"),
]


# ------------------------------------------------------------------------------------- the dumps
@contextlib.contextmanager
def fake_group():
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch._dynamo.reset()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield
    finally:
        dist.destroy_process_group()
        torch._dynamo.reset()


@contextlib.contextmanager
def moe_stub():
    """The fake group communicates nothing, so ``moe_experts``, ``moe_experts_backward`` (and the
    dropless count exchange) would run on garbage: run the ops as shape-only stubs. Only the compile-time dumps matter."""
    import torch

    from overlap_backend.runtime import lowering, ops

    def stub(x, send, recv, rows, offsets, sizes, w_gate, w_up, w_down, group_name, saved, comm_sms=-1):
        m, f = rows.shape[0], w_gate.shape[2]
        shapes = {"recv": (sum(recv), x.shape[1]), "xg": (m, x.shape[1]), "gate": (m, f), "up": (m, f), "act": (m, f)}
        values = [torch.zeros(shapes[n], dtype=x.dtype if n == "recv" else w_gate.dtype) if want else x.new_empty((0,))
                  for n, want in zip(ops.MOE_SAVED, saved)]
        return torch.zeros_like(x), values

    def stub_backward(grad, send, recv, rows, offsets, sizes, gate, up, wt_gate, wt_up, wt_down, group_name):
        m, h, f = rows.shape[0], grad.shape[1], gate.shape[1]
        cd = wt_gate.dtype
        return torch.zeros_like(grad), torch.zeros(m, h, dtype=cd), torch.zeros(m, f, dtype=cd), torch.zeros(m, f, dtype=cd)

    impls = lowering._IMPLS["p2p"]
    saved_impl, saved_bwd = impls["moe_experts"], impls["moe_experts_backward"]
    saved_check, saved_bwd_check = ops._checks.check_moe_experts, ops._checks.check_moe_experts_backward
    impls["moe_experts"], impls["moe_experts_backward"] = stub, stub_backward
    ops._checks.check_moe_experts = ops._checks.check_moe_experts_backward = lambda *a, **k: None
    try:
        with torch._dynamo.config.patch(capture_scalar_outputs=True):
            yield
    finally:
        impls["moe_experts"], impls["moe_experts_backward"] = saved_impl, saved_bwd
        ops._checks.check_moe_experts, ops._checks.check_moe_experts_backward = saved_check, saved_bwd_check


def run_example(ex: Example, cache: dict) -> str:
    """Compile ``ex`` (once per builder), return its excerpt (markdown)."""
    import torch

    import overlap_backend

    key = ex.build
    if key not in cache:
        tmp = tempfile.mkdtemp(prefix="overlap_docs_")
        with fake_group(), moe_stub():
            fn, args, overrides, train = ex.build()
            backend = overlap_backend.make_backend(inductor=False, debug_dir=tmp, lowering="p2p", **overrides)
            compiled = torch.compile(fn, backend=backend, fullgraph=not train or isinstance(fn, torch.nn.Module))
            if train:
                out = compiled(*args)
                (out[0] if isinstance(out, tuple) else out).sum().backward()
            else:
                with torch.no_grad():
                    compiled(*args)
        cache[key] = (Path(tmp) / "rank0", [r.to_json() for r in backend.reports])
    rank_dir, reports = cache[key]
    report = next(r for r in reports if ex.graph == "first" or r["kind"] == ex.graph)
    gdir = rank_dir / report["id"]
    mode, *passes = ex.show
    if mode == "json":
        recs = [m for m in report["matches"] if m["pass"] in passes]
        if ex.graph == "backward":  # the graph's record, as summary.json has it (without the process-wide id)
            return _fence("json", json.dumps({"kind": report["kind"], "matches": recs}, sort_keys=True))
        return _fence("json", "\n".join(json.dumps(m, sort_keys=True) for m in recs))
    out = []
    for p in passes:
        after = _step_file(gdir, f"after_{p}.py")
        diff = _step_file(gdir, f"{p}.diff")
        label = lambda f: f"# {report['kind']} graph: {f.name}" if ex.graph != "first" else f"# {f.name}"  # noqa: E731
        if mode == "before_after":
            before = gdir / "00_before.py"
            text = [label(before), _body(before.read_text())]
            norm = _step_file(gdir, "normalize.diff")
            if norm is not None:
                text.append(f"# {_step_file(gdir, 'after_normalize.py').name}: the copy is gone, wait_tensor is returned")
            text += [label(after), _body(after.read_text())]
            out.append("\n".join(text))
        elif diff is None:
            out.append(f"# {p}: no change")
        elif mode == "diff":
            out.append(label(diff) + "\n" + _hunks(diff.read_text()))
        else:  # "changes": only the removed and added lines
            lines = [ln for ln in _hunks(diff.read_text()).splitlines() if ln[:1] in "+-"]
            out.append(label(diff) + " (only the lines that change)\n" + "\n".join(lines))
    return _fence("diff" if mode in ("diff", "changes") else "python", "\n".join(out))


def _step_file(gdir: Path, suffix: str) -> Path | None:
    found = sorted(f for f in gdir.iterdir() if re.fullmatch(r"\d\d_" + re.escape(suffix), f.name))
    return found[-1] if found else None


def _body(src: str) -> str:
    """The graph source without its ``def forward(...)`` line."""
    return "\n".join(ln for ln in src.rstrip().splitlines() if not ln.startswith("def forward"))


def _hunks(diff: str) -> str:
    return "\n".join(ln for ln in diff.rstrip().splitlines() if not ln.startswith(("---", "+++")))


def _fence(lang: str, body: str) -> str:
    return f"```{lang}\n{body.rstrip()}\n```"


# ----------------------------------------------------------------------------------------- main
def render(text: str, blocks: dict[str, str]) -> str:
    for name, body in blocks.items():
        begin, end = BEGIN.format(name=name), END.format(name=name)
        pat = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
        if not pat.search(text):
            raise SystemExit(f"{PASSES_MD}: no block {begin!r} ... {end!r}")
        text = pat.sub(lambda _: f"{begin}\n{body}\n{end}", text)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/passes.md is out of date")
    ap.add_argument("--list", action="store_true", help="print the example names")
    ap.add_argument("--print", action="store_true", help="print the blocks, write nothing")
    ap.add_argument("names", nargs="*", help="only these examples (default: all)")
    opts = ap.parse_args(argv)
    if opts.list:
        print("\n".join(ex.name for ex in EXAMPLES))
        return 0
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("overlap_backend").setLevel(logging.WARNING)
    import overlap_backend  # noqa: F401

    cache: dict = {}
    chosen = [ex for ex in EXAMPLES if not opts.names or ex.name in opts.names]
    blocks = {ex.name: run_example(ex, cache) for ex in chosen}
    if opts.print:
        for name, body in blocks.items():
            print(f"=== {name}\n{body}\n")
        return 0
    old = PASSES_MD.read_text()
    new = render(old, blocks)
    if opts.check:
        if new != old:
            print(f"{PASSES_MD} is out of date: run python docs/make_pass_examples.py", file=sys.stderr)
            return 1
        return 0
    if new != old:
        PASSES_MD.write_text(new)
    print(f"{len(blocks)} examples, {PASSES_MD} {'updated' if new != old else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
