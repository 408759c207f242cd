"""Epilogue capture: the pointwise nodes after a GEMM-collective that its op can compute itself.

``walk(head, ...)`` only looks: starting at the value the op will produce (``ag_mm``: a matmul;
``mm_rs`` / ``mm_ar``: the collective's ``wait_tensor``), it follows the single chain of users
while each one is a step of ``spec/epilogue.py``'s closed set:

- ``add(x, t)``: ``t`` a ``[N]`` vector (``bias``) or a tensor of ``x``'s shape (``add``: a residual), same dtype;
- ``mul(x, s)``, ``s`` a Python number (``mul``);
- ``convert_element_type(x, dtype)`` (``cast``), unless it widens the output past the GEMM's dtype
  (the op would write more bytes; the consumer of the cast fuses it for free);
- GELU (erf or tanh form), SiLU, and (``ag_mm``) ``silu(x) * y`` where ``y`` is another output of the
  same op (``swiglu``), matched in their decomposed post-grad forms with Inductor's matcher (as
  ``cta_pipeline`` does);
- reshapes that keep the last dim (``mm → view [B, S, N] → add``), carried along.

It stops at the first node that is none of these, or whose value is used anywhere else than the
next step ("every use allows it": a value saved for backward, or a residual stream read twice,
stays in the graph), and says why; the pass reports that reason in ``summary.json``. Trailing
reshapes with no step after them are left in the graph.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
import torch.fx
import torch.nn.functional as F

from ..codegen.epilogue import MAX_POINTERS as MAX_TENSORS  # tensors one epilogue may read (P0..P3)
from ..spec import epilogue as spec_mod
from ..spec import knobs
from .fx import RESHAPES, ancestors, aten, call, val
from .rejected import Rejected
from .sizes import known_eq, require_sizes_available, size_args

prims = torch.ops.prims


@functools.cache
def _patterns():
    """(step, pattern, constants): gelu / gelu_tanh / silu (input ``v``), swiglu (``g``, ``u``)."""
    from torch._inductor.pattern_matcher import fwd_only, gen_pattern

    from .cta_pipeline import pattern_constants

    def gelu(v):
        return F.gelu(v)

    def gelu_tanh(v):
        return F.gelu(v, approximate="tanh")

    def silu(v):
        return F.silu(v)

    def swiglu(g, u):
        return F.silu(g) * u

    def swiglu_rev(g, u):
        return u * F.silu(g)

    out = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        one = [torch.empty(4, 4, dtype=dtype)]
        two = one + [torch.empty(4, 4, dtype=dtype)]
        for step, fn, ex in (("gelu_tanh", gelu_tanh, one), ("gelu", gelu, one), ("swiglu", swiglu, two),
                             ("swiglu", swiglu_rev, two), ("silu", silu, one)):
            traced = fwd_only(fn, ex)
            consts = pattern_constants(n for n in traced.graph.nodes if n.op == "call_function")
            out.append((step, gen_pattern(fn, ex, fwd_only), consts))
    return out


@dataclass
class Capture:
    """What ``walk`` found after one op output."""

    steps: list[str] = field(default_factory=list)  # spec steps; bias/add name "#<i>" of ``args``
    args: list[torch.fx.Node] = field(default_factory=list)
    partners: list[int] = field(default_factory=list)  # swiglu: the other output index, per swiglu step
    nodes: list[torch.fx.Node] = field(default_factory=list)  # captured nodes (pointwise + reshapes)
    end: torch.fx.Node | None = None  # the node whose value the epilogue computes
    stop: str = ""  # why the walk stopped

    def spec(self, arg_index: dict[torch.fx.Node, int]) -> str:
        """The spec with ``#i`` replaced by the op-wide index of ``args[i]``."""
        out = []
        for s in self.steps:
            kind, _, p = s.partition(":")
            out.append(f"{kind}:{arg_index[self.args[int(p[1:])]]}" if p.startswith("#") else s)
        return ",".join(out)

    def report(self) -> dict:
        return {"captured": [n.name for n in self.nodes], "left": self.stop}

    def single_output_spec(self) -> str:
        """The spec of a one-output op (``mm_rs``, ``mm_ar``) whose epilogue arguments are ``args`` in order."""
        return self.spec({a: i for i, a in enumerate(self.args)})

    def single_output_report(self) -> list[dict]:
        """The epilogue report of a one-output op."""
        return [{"output": 0, "spec": self.single_output_spec(), **self.report()}]

    def single_output_op_args(self) -> tuple:
        """The trailing ``(spec, args)`` of a one-output op's call; nothing without a captured step."""
        return (self.single_output_spec(), list(self.args)) if self.steps else ()


def _is_reshape_keeping_last(node: torch.fx.Node, n: int) -> bool:
    v = val(node)
    return node.target in RESHAPES and isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[-1] == n


def _descendants(node: torch.fx.Node, depth: int) -> list[torch.fx.Node]:
    seen, frontier = [], [node]
    for _ in range(depth):
        nxt = []
        for n in frontier:
            for u in n.users:
                if u not in seen:
                    seen.append(u)
                    nxt.append(u)
        frontier = nxt
    return seen


def _activation(cur: torch.fx.Node, partners: dict[torch.fx.Node, int]):
    """(step, root, nodes, partner index or None) of an activation whose input is ``cur``, whose
    inner values feed nothing else; or None."""
    from .cta_pipeline import pattern_constants

    order = {n: i for i, n in enumerate(cur.graph.nodes)}
    roots = [r for r in sorted(_descendants(cur, knobs.passes.EPILOGUE_PATTERN_DEPTH), key=order.__getitem__) if r.op == "call_function"]
    # silu(x) * y before silu(x) alone: the longer match wins
    candidates = [(root, p) for p in _patterns() if p[0] == "swiglu" for root in roots]
    candidates += [(root, p) for root in roots for p in _patterns() if p[0] != "swiglu"]
    for root, (step, pattern, consts) in candidates:
        if True:
            m = pattern.match(root)
            if not m:
                continue
            nodes = [n for n in m.nodes if isinstance(n, torch.fx.Node)]
            if pattern_constants(nodes) != consts:
                continue
            inp = m.kwargs.get("g" if step == "swiglu" else "v")
            if inp is not cur:
                continue
            partner = None
            if step == "swiglu":
                partner = partners.get(m.kwargs.get("u"))
                if partner is None:
                    continue
            inner = set(nodes)
            if not set(cur.users) <= inner or any(not set(n.users) <= inner for n in nodes if n is not root):
                continue
            return step, root, nodes, partner
    return None


def fusion_off(setting: bool | str, value) -> str | None:
    """Why no epilogue is captured after a GEMM whose output is ``value`` (None: capture).
    ``setting``: ``OverlapConfig.fuse_epilogues``; ``auto`` captures for CPU tensors only (the
    fused kernels measured slower than the unfused ops on CUDA: docs/codegen.md)."""
    if setting is False:
        return "epilogue fusion is off (OVERLAP_FUSE_EPILOGUES=0)"
    if setting == "auto" and isinstance(value, torch.Tensor) and value.device.type == "cuda":
        return ("epilogue fusion is off on CUDA by default (OVERLAP_FUSE_EPILOGUES=auto: the fused kernels measured "
                "slower than the unfused ops, docs/codegen.md); OVERLAP_FUSE_EPILOGUES=1 turns it on")
    return None


def walk(head: torch.fx.Node, forbidden: set[torch.fx.Node], partners: dict[torch.fx.Node, int] | None = None,
         enabled: bool | str = True) -> Capture:
    """The epilogue chain after ``head`` (see the module docstring). ``forbidden``: nodes a
    captured tensor argument must not be computed from (the match's own nodes); ``partners``:
    ``ag_mm``'s other outputs (their values' nodes) that ``swiglu`` may read."""
    cap = Capture()
    hv = val(head)
    off = fusion_off(enabled, hv)
    if off:
        cap.stop = off
        return cap
    if not isinstance(hv, torch.Tensor) or hv.dim() < 1:
        cap.stop = f"no tensor metadata on {head.name}"
        return cap
    n = hv.shape[-1]
    numel = hv.numel()
    dtype = hv.dtype
    cur, pending = head, []  # pending: reshapes not yet followed by a step
    partners = partners or {}
    while True:
        users = list(cur.users)
        if not users:
            cap.stop = f"{cur.name} has no users"
            break
        if len(users) == 1 and _is_reshape_keeping_last(users[0], n):
            pending.append(users[0])
            cur = users[0]
            continue
        act = _activation(cur, partners)
        if act is not None:
            step, root, nodes, partner = act
            if step == "swiglu":
                if len(set(cap.args)) + len(cap.partners) >= MAX_TENSORS:
                    cap.stop = f"{root.name}: the epilogue would read more than {MAX_TENSORS} tensors"
                    break
                cap.partners.append(partner)
                step = f"swiglu:{partner}"
            cap.steps.append(step)
            cap.nodes += pending + [x for x in nodes if x not in cap.nodes]
            pending = []
            cap.end = cur = root
            dtype = val(root).dtype
            continue
        if len(users) > 1:
            cap.stop = f"{cur.name} has {len(users)} users ({', '.join(u.name for u in users)})"
            break
        (u,) = users
        step, why = _pointwise_step(u, cur, n, numel, dtype, forbidden | set(cap.nodes) | set(pending), hv.dtype)
        if step is None:
            cap.stop = why
            break
        kind, arg = step
        if arg is not None:
            if arg not in cap.args and len(set(cap.args)) + len(cap.partners) >= MAX_TENSORS:
                cap.stop = f"{u.name}: the epilogue would read more than {MAX_TENSORS} tensors"
                break
            if arg not in cap.args:
                cap.args.append(arg)
            kind = f"{kind}:#{cap.args.index(arg)}"
        cap.steps.append(kind)
        cap.nodes += pending + [u]
        pending = []
        cap.end = cur = u
        dtype = val(u).dtype
    return cap


def _pointwise_step(u: torch.fx.Node, cur: torch.fx.Node, n: int, numel: int, dtype: torch.dtype,
                    forbidden: set[torch.fx.Node], gemm_dtype: torch.dtype):
    """((kind, tensor arg or None), None) when ``u`` is a step applied to ``cur``; else (None, why).
    ``gemm_dtype``: the GEMM's output dtype (a cast may not make the op's output wider)."""
    uv = val(u)
    what = f"{u.name} ({u.target})"
    if u.op == "output":
        return None, f"{cur.name} is a graph output"
    if not isinstance(uv, torch.Tensor) or uv.numel() != numel or uv.shape[-1:] != (n,):
        if u.target in RESHAPES:
            return None, f"{what} reshapes to {tuple(uv.shape)}: the last dim changes"
        return None, f"{what} does not keep the output's shape"
    if u.target is aten.add.Tensor and len(u.args) == 2 and u.kwargs.get("alpha", 1) == 1:
        a, b = u.args
        other = b if a is cur else a
        if a is b or not isinstance(other, torch.fx.Node):
            return None, f"{what} is not x + tensor"
        ov = val(other)
        if not isinstance(ov, torch.Tensor) or ov.dtype != dtype or uv.dtype != dtype:
            return None, f"{what}: the added tensor {other.name} is not {dtype} (no type promotion in epilogues)"
        if (ancestors(other) | {other}) & forbidden:
            return None, f"{what}: the added tensor {other.name} is computed from the matched nodes"
        if tuple(ov.shape) == tuple(val(cur).shape):
            return ("add", other), None
        if ov.numel() == n and ov.dim() >= 1 and ov.shape[-1] == n:
            return ("bias", other), None
        return None, f"{what}: the added tensor {other.name} {tuple(ov.shape)} is neither [N] nor the output's shape"
    if u.target is aten.mul.Tensor and len(u.args) == 2 and not u.kwargs:
        a, b = u.args
        s = b if a is cur else a
        if isinstance(s, (int, float)) and not isinstance(s, bool) and uv.dtype == dtype:
            return (spec_mod.format_spec([spec_mod.Step("mul", float(s))]), None), None
        return None, f"{what} is not x * a Python number"
    if u.target is prims.convert_element_type.default and u.args[0] is cur:
        if u.args[1] not in spec_mod.DTYPE_NAMES:
            return None, f"{what} casts to {u.args[1]}"
        if u.args[1].itemsize > gemm_dtype.itemsize:
            # the op would write (and mm_rs ship) the wider tensor, where the consumer that reads
            # the cast's value fuses it for free (2xH200, TP block: `out.float()` after mm_rs)
            return None, f"{what} widens {gemm_dtype} to {u.args[1]}: it stays with its consumer"
        return (f"cast:{spec_mod.DTYPE_NAMES[u.args[1]]}", None), None
    return None, f"{what} is not an epilogue step"


def result_node(graph: torch.fx.Graph, out: torch.fx.Node, cap: Capture) -> torch.fx.Node:
    """The node that takes the place of ``cap.end``: the op's output ``out``, reshaped to the
    end's shape when they differ (insert it where ``out`` was inserted)."""
    if cap.end is None:
        return out
    shape = list(val(cap.end).shape)
    if len(val(out).shape) == len(shape) and all(known_eq(a, b) for a, b in zip(val(out).shape, shape)):
        return out
    return call(graph, aten.reshape.default, (out, size_args(graph, shape, out)))


def chain_end_users_ok(collective: torch.fx.Node, internal: set[torch.fx.Node]) -> str | None:
    """Why nothing may be captured after a collective whose un-waited value is read elsewhere
    (saved for backward: that reader needs the value before the epilogue)."""
    others = [u for u in collective.users if u not in internal]
    if others:
        return f"{collective.name} is also read by {[u.name for u in others]}: its value is needed before any epilogue"
    return None


def end_sizes_error(cap: Capture, before: torch.fx.Node) -> str | None:
    """Why the reshape back to ``cap.end``'s shape (``result_node``, inserted before ``before``)
    could not be written: a symbolic size that nothing before ``before`` computes."""
    if cap.end is None:
        return None
    try:
        require_sizes_available(before.graph, val(cap.end).shape, before)
    except Rejected as e:
        return f"epilogue not captured: {e}"
    return None


def capture_after_collective(ctx, wait: torch.fx.Node, collective: torch.fx.Node, matched: list[torch.fx.Node],
                             shape, dtype) -> Capture:
    """``mm_rs`` / ``mm_ar``: the chain after the collective's wait, checked against the op's
    output (``shape``, ``dtype``)."""
    if why := chain_end_users_ok(collective, set(matched)):
        return Capture(stop=why)
    cap = walk(wait, set(matched), None, ctx.config.fuse_epilogues)
    if cap.steps:
        try:
            spec_mod.check([cap.single_output_spec()], [val(a) for a in cap.args], [shape],
                           [dtype], allow_out_refs=False)
        except spec_mod.EpilogueError as e:
            return Capture(stop=f"epilogue not captured: {e}")
        if why := end_sizes_error(cap, wait):
            return Capture(stop=why)
    return cap


def rewrite_after_collective(graph: torch.fx.Graph, op: torch.fx.Node, cap: Capture) -> list[torch.fx.Node]:
    """Point the chain's users at the op's result (after ``op``, reshaped when needed); the captured
    nodes to erase (users first)."""
    if cap.end is None:
        return []
    with graph.inserting_after(op):
        end = result_node(graph, op, cap)
    cap.end.replace_all_uses_with(end)
    return list(reversed(cap.nodes))
