"""The ``torch.ops.overlap`` custom ops: schema, exact semantics, fake implementation, dispatch.

Each rewrite in ``passes/`` replaces the matched subgraph by ONE of these ops. An op's real
implementation is looked up in the lowering registry by the ``lowering`` argument, which the pass
resolved at compile time (identically on every rank), so the graph says how it will run.

Shapes below: ``ws`` is the size of the process group named by ``group_name``.

The ops are defined with ``torch.library.Library`` and an explicit schema (written out above each
function) instead of ``torch.library.custom_op``: the dispatcher then calls the Python function
directly, without custom_op's autograd wrapper, Dynamo-disable wrapper and output-alias checks,
which cost tens of microseconds per call (measured: 35 vs 12 us for an empty op on the CPU
machines) — a real share of a decode-size op. The ops have no autograd formula: they appear in
AOTAutograd's forward/backward graphs, which run without autograd; called in grad mode with a tensor that
requires grad, an op raises (``_define``'s thin kernel wrapper, one ``is_grad_enabled`` call otherwise).
"""

import math
from collections.abc import Sequence
from typing import Optional

import torch
from torch import Tensor

from . import checks as _checks
from ..spec import epilogue as _epilogue
from . import lowering as _lowering
from .checks import OverlapGroupError, OverlapInputError  # noqa: F401  (re-exported)

_LIB = torch.library.Library("overlap", "DEF")


def _define(schema: str, tags: tuple = ()):
    """Define ``overlap::<schema>``; the decorated function is its kernel for every backend, refusing a
    tensor that requires grad while grad mode is on (the ops have no autograd formula: run there, autograd
    would record the local steps and miss the communication, which gives wrong gradients)."""
    name = schema.split("(", 1)[0]
    _LIB.define(schema, tags=tags)
    arg_names = [a.name for a in getattr(torch.ops.overlap, name).default._schema.arguments]

    def deco(fn):
        def kernel(*args, **kwargs):
            if torch.is_grad_enabled():
                _checks.check_no_autograd(name, arg_names, args, kwargs)
            return fn(*args, **kwargs)

        kernel.__name__, kernel.__qualname__, kernel.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
        _LIB.impl(name, kernel, "CompositeExplicitAutograd")
        return fn

    return deco


def _fake(name: str):
    return torch.library.register_fake(f"overlap::{name}", lib=_LIB)


def _flat_rows(shape) -> int:
    return math.prod(shape[:-1])


# --------------------------------------------------------------------------------------- ag_mm
@_define(
    "ag_mm(Tensor shard, Tensor[] weights, Tensor?[] biases, SymInt gather_dim, str group_name, str lowering, bool return_gathered, str epilogue=\"\", Tensor[]? epilogue_args=None) -> (Tensor, Tensor[])"
)
def ag_mm(
    shard: Tensor,
    weights: list[Tensor],
    biases: list[Optional[Tensor]],
    gather_dim: int,
    group_name: str,
    lowering: str,
    return_gathered: bool,
    epilogue: str = "",
    epilogue_args: Optional[Sequence[Tensor]] = None,
) -> tuple[Tensor, list[Tensor]]:
    """All-gather then matmul(s), with the gather decomposed so each step's matmul overlaps it.

    Semantics, with ``G = all_gather(shard, dim=gather_dim)`` (rank r's shard is r-th along
    ``gather_dim``, as ``funcol.all_gather_tensor`` gives) and ``K = G.shape[-1]``::

        outs[i] = G.reshape(-1, K) @ weights[i]  (+ biases[i] when not None)   # [prod(G.shape[:-1]), N_i]
        gathered = G if return_gathered else an empty tensor

    ``gather_dim`` may be the last dim (the contraction dim is gathered: the matmul becomes a sum
    of per-chunk partial products). ``weights[i]`` is ``[K, N_i]``; ``biases[i]`` is ``[N_i]``.

    ``epilogue`` (empty, or one spec per output joined by ``|``; ``spec/epilogue.py`` defines
    them) then transforms ``outs[i]`` in place of the graph's pointwise nodes, reading
    ``epilogue_args``.
    """
    args = list(epilogue_args or ())
    key = ("ag_mm", _checks.tensor_key(shard), _checks.tensors_key(weights), _checks.tensors_key(biases), gather_dim,
           group_name, lowering, return_gathered, epilogue, _checks.tensors_key(args))
    found = _checks.CHECKED.get(key)
    if found is None:  # the first call of this key: every check (later calls of it skip them)
        impl = _lowering.implementation(lowering, "ag_mm")
        group = _checks.resolve_group("ag_mm", group_name)
        dim = _checks.check_ag_mm(shard, weights, biases, gather_dim, group)
        specs = _check_epilogues("ag_mm", epilogue, len(weights), args,
                                 [(_ag_rows(shard, dim, group.size()), w.shape[1]) for w in weights],
                                 shard.dtype, allow_out_refs=True)[0]
        found = (_lowering.bound(impl), specs)
        if _checks.check_agreement("ag_mm", group, [("shard", shard), ("weights", weights), ("biases", biases),
                                                    ("gather_dim", gather_dim), ("epilogue", epilogue)]):
            _checks.remember_checked(key, found)  # (this first call runs the unbound impl)
    else:
        impl, specs = found
    return impl(shard, weights, biases, gather_dim, group_name, return_gathered, specs, args)


def _ag_rows(shard, dim, ws) -> int:
    gshape = list(shard.shape)
    gshape[dim] *= ws
    return _flat_rows(gshape)


def _check_epilogues(op, epilogue, outputs, args, shapes, dtype, allow_out_refs=False):
    """Validate ``epilogue`` (one spec per output, ``|``-joined) against the outputs' shapes:
    (the specs, or [] without epilogue; their final dtypes). Errors name the op."""
    try:
        specs = _epilogue.split_outputs(epilogue, outputs) if epilogue else []
        if not specs:
            return specs, [dtype] * len(shapes)
        if len(specs) != len(shapes):
            raise _epilogue.EpilogueError(f"{len(specs)} epilogues for {len(shapes)} outputs")
        _epilogue.check(specs, list(args), shapes, [dtype] * len(shapes), allow_out_refs)
    except _epilogue.EpilogueError as e:
        raise _epilogue.EpilogueError(f"overlap::{op}: argument 'epilogue': {e}") from None
    return specs, [_epilogue.out_dtype(s, dtype) for s in specs]


@_fake("ag_mm")
def _(shard, weights, biases, gather_dim, group_name, lowering, return_gathered, epilogue="", epilogue_args=None):
    ws = group_size(group_name)
    dim = gather_dim % shard.dim()
    gshape = list(shard.shape)
    gshape[dim] *= ws
    rows = _flat_rows(gshape)
    dtypes = _check_epilogues("ag_mm", epilogue, len(weights), list(epilogue_args or ()),
                              [(rows, w.shape[1]) for w in weights], shard.dtype, allow_out_refs=True)[1]
    outs = [shard.new_empty((rows, w.shape[1]), dtype=dt) for w, dt in zip(weights, dtypes)]
    gathered = shard.new_empty(gshape) if return_gathered else shard.new_empty((0,))
    return gathered, outs


# --------------------------------------------------------------------------------------- mm_rs
@_define(
    "mm_rs(Tensor a, Tensor b, Tensor? bias, SymInt[] out_shape, SymInt scatter_dim, str reduce_op, str group_name, str lowering, str epilogue=\"\", Tensor[]? epilogue_args=None) -> Tensor"
)
def mm_rs(
    a: Tensor,
    b: Tensor,
    bias: Optional[Tensor],
    out_shape: list[int],
    scatter_dim: int,
    reduce_op: str,
    group_name: str,
    lowering: str,
    epilogue: str = "",
    epilogue_args: Optional[Sequence[Tensor]] = None,
) -> Tensor:
    """Matmul then reduce-scatter, decomposed so that no communication follows the last compute.

    Semantics: ``C = (a @ b + bias).view(out_shape)`` (``a`` is ``[M, K]``, ``b`` ``[K, N]``,
    ``prod(out_shape[:-1]) == M``, ``out_shape[-1] == N``); returns
    ``reduce_scatter(C, reduce_op, dim=scatter_dim)``: the ``rank``-th of ``ws`` equal chunks of C
    along ``scatter_dim``, reduced over ranks (``funcol.reduce_scatter_tensor``'s semantics).
    ``epilogue`` (``spec/epilogue.py``) is then applied to that reduced chunk (a residual
    ``add`` reads the chunk-shaped tensor of ``epilogue_args``).
    """
    args = list(epilogue_args or ())
    key = ("mm_rs", _checks.tensor_key(a), _checks.tensor_key(b), _checks.tensor_key(bias), tuple(out_shape),
           scatter_dim, reduce_op, group_name, lowering, epilogue, _checks.tensors_key(args))
    impl = _checks.CHECKED.get(key)
    if impl is None:  # the first call of this key: every check (later calls of it skip them)
        impl = _lowering.implementation(lowering, "mm_rs")
        group = _checks.resolve_group("mm_rs", group_name)
        _checks.check_mm_rs(a, b, bias, out_shape, scatter_dim, reduce_op, group)
        _check_epilogues("mm_rs", epilogue, 1, args, [_rs_shape(out_shape, scatter_dim, group.size())], a.dtype)
        if _checks.check_agreement("mm_rs", group, [("a", a), ("b", b), ("bias", bias), ("out_shape", list(out_shape)),
                                                    ("scatter_dim", scatter_dim), ("reduce_op", reduce_op)]):
            _checks.remember_checked(key, _lowering.bound(impl))
    return impl(a, b, bias, out_shape, scatter_dim, reduce_op, group_name, epilogue, args)


def _rs_shape(out_shape, scatter_dim, ws) -> list[int]:
    shape = list(out_shape)
    shape[scatter_dim % len(shape)] //= ws
    return shape


@_fake("mm_rs")
def _(a, b, bias, out_shape, scatter_dim, reduce_op, group_name, lowering, epilogue="", epilogue_args=None):
    shape = _rs_shape(out_shape, scatter_dim, group_size(group_name))
    (dtype,) = _check_epilogues("mm_rs", epilogue, 1, list(epilogue_args or ()), [shape], torch.result_type(a, b))[1]
    return a.new_empty(shape, dtype=dtype)


# --------------------------------------------------------------------------------------- mm_ar
@_define(
    "mm_ar(Tensor a, Tensor b, Tensor? bias, str reduce_op, str group_name, str lowering, str epilogue=\"\", Tensor[]? epilogue_args=None) -> Tensor"
)
def mm_ar(
    a: Tensor,
    b: Tensor,
    bias: Optional[Tensor],
    reduce_op: str,
    group_name: str,
    lowering: str,
    epilogue: str = "",
    epilogue_args: Optional[Sequence[Tensor]] = None,
) -> Tensor:
    """Matmul then all-reduce: a fused reduce-scatter (as ``mm_rs``, over row chunks), then an
    all-gather of the reduced chunks.

    Semantics: ``all_reduce(a @ b + bias, reduce_op)``, shape ``[M, N]``, then ``epilogue``
    (``spec/epilogue.py``) on it.
    """
    args = list(epilogue_args or ())
    key = ("mm_ar", _checks.tensor_key(a), _checks.tensor_key(b), _checks.tensor_key(bias), reduce_op, group_name,
           lowering, epilogue, _checks.tensors_key(args))
    impl = _checks.CHECKED.get(key)
    if impl is None:  # the first call of this key: every check (later calls of it skip them)
        impl = _lowering.implementation(lowering, "mm_ar")
        group = _checks.resolve_group("mm_ar", group_name)
        _checks.check_mm_ar(a, b, bias, reduce_op)
        _check_epilogues("mm_ar", epilogue, 1, args, [(a.shape[0], b.shape[1])], a.dtype)
        if _checks.check_agreement("mm_ar", group, [("a", a), ("b", b), ("bias", bias), ("reduce_op", reduce_op)]):
            _checks.remember_checked(key, _lowering.bound(impl))
    return impl(a, b, bias, reduce_op, group_name, epilogue, args)


@_fake("mm_ar")
def _(a, b, bias, reduce_op, group_name, lowering, epilogue="", epilogue_args=None):
    (dtype,) = _check_epilogues("mm_ar", epilogue, 1, list(epilogue_args or ()), [(a.shape[0], b.shape[1])],
                                torch.result_type(a, b))[1]
    return a.new_empty((a.shape[0], b.shape[1]), dtype=dtype)


def group_size(group_name: str) -> int:
    """The size of the process group named ``group_name`` (the ops' ``ws``)."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(group_name).size()




REDUCE_OPS = _checks.REDUCE_OPS


OPS = {"ag_mm": torch.ops.overlap.ag_mm, "mm_rs": torch.ops.overlap.mm_rs, "mm_ar": torch.ops.overlap.mm_ar}


# --------------------------------------------------------------------------------- moe_experts
MOE_SAVED = ("recv", "xg", "gate", "up", "act")


@_define(
    "moe_experts(Tensor x, SymInt[] send_splits, SymInt[] recv_splits, Tensor rows, Tensor? offsets, SymInt[] group_sizes, Tensor w_gate, Tensor w_up, Tensor w_down, str group_name, str lowering, bool[] saved, int comm_sms=-1) -> (Tensor, Tensor[])"
)
def moe_experts(
    x: Tensor,
    send_splits: list[int],
    recv_splits: list[int],
    rows: Tensor,
    offsets: Optional[Tensor],
    group_sizes: list[int],
    w_gate: Tensor,
    w_up: Tensor,
    w_down: Tensor,
    group_name: str,
    lowering: str,
    saved: list[bool],
    comm_sms: int = -1,
) -> tuple[Tensor, list[Tensor]]:
    """Expert-parallel MoE block: dispatch all-to-all, SwiGLU experts, combine all-to-all.

    ``x`` ``[N_send, H]``: this rank's token rows, ``send_splits[d]`` of them for rank ``d``, in rank
    order. ``w_gate``/``w_up`` ``[E, H, F]``, ``w_down`` ``[E, F, H]``: this rank's ``E`` experts; their
    dtype is the compute dtype ``cd``. They may be strided views, read in place: e.g. the halves
    ``W[..., :F]``, ``W[..., F:]`` of a fused gate/up weight ``W`` ``[E, H, 2F]`` (or of
    ``W.transpose(1, 2)`` for one stored ``[E, 2F, H]``, as ``F.linear`` uses it). Semantics::

        R   = all_to_all_single(x, recv_splits, send_splits)        # [N_recv, H] received rows
        Xg[j] = R[rows[j]].to(cd), or 0 where rows[j] < 0            # [M, H] expert-grouped rows
        expert e owns grouped rows ends[e-1] <= j < ends[e]          # ends = offsets, or cumsum(group_sizes)
        G = Xg @ w_gate[e],  U = Xg @ w_up[e],  A = silu(G) * U,  Y = A @ w_down[e]   (rows of expert e;
                                                                     rows past ends[-1]: all 0)
        Yr[rows[j]] = Y[j].to(x.dtype); received rows no j points at are 0   # rows[] distinct
        out = all_to_all_single(Yr, send_splits, recv_splits)       # [N_send, H], same order as x

    ``offsets`` is ``torch._grouped_mm``'s ``offs`` (int32 cumulative ends, on the device); when it
    is None, ``group_sizes`` (ints, possibly unbacked SymInts) gives the rows of each expert.
    ``saved[i]`` asks for ``MOE_SAVED[i]`` = ``R``, ``Xg``, ``G``, ``U``, ``A`` in ``saved_values[i]``
    (what a training forward keeps for backward); unrequested ones are empty tensors.
    Returns ``(out, saved_values)``. ``comm_sms`` (``symm`` only; -1: ``OVERLAP_MOE_COMM_SMS``) is the
    SM count of the communication kernel as the cost model chose it (0: none, the copy engine does the
    whole combine); it never changes the result.
    """
    group = _checks.resolve_group("moe_experts", group_name)
    _checks.check_moe_experts(x, send_splits, recv_splits, rows, offsets, group_sizes, w_gate, w_up, w_down, saved,
                              group, MOE_SAVED, comm_sms)
    # Token rows (x, rows), splits and expert sizes are per-rank values (dropless routing): checked on every
    # call, not agreed, and not part of the key the implementation is bound to, which must be the same on
    # every rank (the private graphs' protocol follows its calls).
    key = ("moe_experts", x.shape[-1], x.dtype, x.device, _checks.tensors_key((w_gate, w_up, w_down)),
           offsets is not None, tuple(saved), comm_sms, group_name, lowering)
    impl = _checks.CHECKED.get(key)
    if impl is None:
        impl = _lowering.implementation(lowering, "moe_experts")
        if _checks.check_agreement("moe_experts", group, [
                ("x", _checks.row_width(x)), ("w_gate", w_gate), ("w_up", w_up), ("w_down", w_down),
                ("offsets", offsets is not None), ("saved", list(saved)), ("comm_sms", comm_sms)]):
            _checks.remember_checked(key, _lowering.bound(impl))
    extra = {"comm_sms": comm_sms} if comm_sms >= 0 else {}
    return impl(x, send_splits, recv_splits, rows, offsets, group_sizes, w_gate, w_up, w_down, group_name, saved, **extra)


@_fake("moe_experts")
def _(x, send_splits, recv_splits, rows, offsets, group_sizes, w_gate, w_up, w_down, group_name, lowering, saved,
      comm_sms=-1):
    h, f, m = x.shape[-1], w_gate.shape[-1], rows.shape[0]
    cd = w_gate.dtype
    shapes = {
        "recv": ((sum(recv_splits), h), x.dtype),
        "xg": ((m, h), cd),
        "gate": ((m, f), cd),
        "up": ((m, f), cd),
        "act": ((m, f), cd),
    }
    if len(saved) != len(MOE_SAVED):
        raise ValueError(f"overlap::moe_experts: saved has {len(saved)} flags, expected {len(MOE_SAVED)} {MOE_SAVED}")
    values = []
    for name, want in zip(MOE_SAVED, saved):
        shape, dtype = shapes[name] if want else ((0,), x.dtype)
        values.append(x.new_empty(shape, dtype=dtype))
    return x.new_empty(x.shape), values


OPS["moe_experts"] = torch.ops.overlap.moe_experts


# cudagraph_unsafe: its only lowering (p2p) reads the per-expert counts on the host, which a CUDA-graph
# capture cannot; Inductor then runs it between captured partitions, or leaves its graph uncaptured
# (the moe pass does not rewrite a match it knows will be captured: MoePass._decide)
@_define(
    "moe_experts_backward(Tensor grad, SymInt[] send_splits, SymInt[] recv_splits, Tensor rows, Tensor? offsets, SymInt[] group_sizes, Tensor gate, Tensor up, Tensor wt_gate, Tensor wt_up, Tensor wt_down, str group_name, str lowering) -> (Tensor, Tensor, Tensor, Tensor)",
    tags=(torch.Tag.cudagraph_unsafe,),
)
def moe_experts_backward(
    grad: Tensor,
    send_splits: list[int],
    recv_splits: list[int],
    rows: Tensor,
    offsets: Optional[Tensor],
    group_sizes: list[int],
    gate: Tensor,
    up: Tensor,
    wt_gate: Tensor,
    wt_up: Tensor,
    wt_down: Tensor,
    group_name: str,
    lowering: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The input gradient of ``moe_experts``' block, as a backward graph computes it between its two
    all-to-alls (the weight gradients stay in the graph: they read ``dY``, ``dG``, ``dU``).

    ``grad`` ``[N_send, H]``: the gradient of ``moe_experts``' ``out`` (send order); ``rows``,
    ``offsets`` / ``group_sizes`` and the splits: the forward op's. ``gate`` / ``up`` ``[M, F]``: the
    forward's ``G`` and ``U`` (grouped rows). ``wt_gate`` / ``wt_up`` ``[E, F, H]`` and ``wt_down``
    ``[E, H, F]``: the expert weights transposed, as the backward graph holds them (strided views
    too, e.g. the halves along dim 1 of a fused ``[E, 2F, H]``); their dtype is the compute dtype
    ``cd``. Semantics::

        R   = all_to_all_single(grad, recv_splits, send_splits)     # the received rows' result gradients
        dY[j] = R[rows[j]].to(cd), or 0 where rows[j] < 0            # [M, H]
        dA = dY @ wt_down[e],  dU = dA * silu(G),  dG = dA * U * silu'(G)     (rows of expert e;
        dX = dG @ wt_gate[e] + dU @ wt_up[e]                                    rows past ends[-1]: 0)
        dR[i] = sum of dX[j].to(grad.dtype) over the j with rows[j] == i      # rows no j points at: 0
        dx  = all_to_all_single(dR, send_splits, recv_splits)        # [N_send, H], same order as grad

    with ``silu'(g) = sigmoid(g) (1 + g (1 - sigmoid(g)))``. Returns ``(dx, dY, dG, dU)``.
    """
    impl = _lowering.implementation(lowering, "moe_experts_backward")
    group = _checks.resolve_group("moe_experts_backward", group_name)
    _checks.check_moe_experts_backward(grad, send_splits, recv_splits, rows, offsets, group_sizes, gate, up, wt_gate,
                                       wt_up, wt_down, group)
    _checks.check_agreement("moe_experts_backward", group, [
        ("grad", _checks.row_width(grad)), ("gate", _checks.row_width(gate)), ("up", _checks.row_width(up)),
        ("wt_gate", wt_gate), ("wt_up", wt_up), ("wt_down", wt_down), ("offsets", offsets is not None)])
    return impl(grad, send_splits, recv_splits, rows, offsets, group_sizes, gate, up, wt_gate, wt_up, wt_down,
                group_name)


@_fake("moe_experts_backward")
def _(grad, send_splits, recv_splits, rows, offsets, group_sizes, gate, up, wt_gate, wt_up, wt_down, group_name,
      lowering):
    m, h, f = rows.shape[0], grad.shape[-1], gate.shape[-1]
    cd = wt_gate.dtype
    return (grad.new_empty(grad.shape), grad.new_empty((m, h), dtype=cd), grad.new_empty((m, f), dtype=cd),
            grad.new_empty((m, f), dtype=cd))


OPS["moe_experts_backward"] = torch.ops.overlap.moe_experts_backward


# ---------------------------------------------------------------------------- cta_pipeline_mlp
CTA_ACTIVATIONS = ("gelu", "swiglu")
GELU_APPROXIMATIONS = ("none", "tanh")


@_define(
    "cta_pipeline_mlp(Tensor x, Tensor w1, Tensor? b1, Tensor? w3, Tensor? b3, Tensor w2, Tensor? b2, str activation, str approximate, SymInt stages, str group_name, str lowering) -> Tensor"
)
def cta_pipeline_mlp(
    x: Tensor,
    w1: Tensor,
    b1: Optional[Tensor],
    w3: Optional[Tensor],
    b3: Optional[Tensor],
    w2: Tensor,
    b2: Optional[Tensor],
    activation: str,
    approximate: str,
    stages: int,
    group_name: str,
    lowering: str,
) -> Tensor:
    """Row-parallel tensor-parallel MLP: column-parallel GEMM, activation, row-parallel GEMM,
    all-reduce, run as a pipeline of ``stages`` stages (CTA-pipelining, docs/cta.md).

    ``x`` ``[M, H]`` (replicated on the group's ranks in tensor parallelism, though the semantics
    do not need it), ``w1``/``w3`` ``[H, F]`` (this rank's column shards), ``w2`` ``[F, N]`` (this
    rank's row shard), ``b1``/``b3`` ``[F]``, ``b2`` ``[N]``. Semantics, on every rank::

        H1 = x @ w1 (+ b1)                                   # [M, F]
        A  = gelu(H1, approximate)          if activation == "gelu"    (approximate: "none" | "tanh")
           = silu(H1) * (x @ w3 (+ b3))     if activation == "swiglu"  (approximate must be "none")
        Y  = A @ w2 (+ b2)                                   # [M, N]; b2 is added on every rank
        out = all_reduce(Y, "sum")                           # [M, N], dtype result_type(x, w1)

    ``w3``/``b3`` are None unless ``activation == "swiglu"``. ``stages`` (>= 1) is the number of
    pipeline stages; it changes how the work is scheduled, never the result.
    """
    key = ("cta_pipeline_mlp", _checks.tensors_key((x, w1, b1, w3, b3, w2, b2)), activation, approximate, stages,
           group_name, lowering)
    impl = _checks.CHECKED.get(key)
    if impl is None:  # the first call of this key: every check (later calls of it skip them)
        impl = _lowering.implementation(lowering, "cta_pipeline_mlp")
        group = _checks.resolve_group("cta_pipeline_mlp", group_name)
        _checks.check_cta_pipeline_mlp(x, w1, b1, w3, b3, w2, b2, activation, approximate, stages,
                                       CTA_ACTIVATIONS, GELU_APPROXIMATIONS)
        if _checks.check_agreement("cta_pipeline_mlp", group, [
                ("x", x), ("w1", w1), ("b1", b1), ("w3", w3), ("b3", b3), ("w2", w2), ("b2", b2),
                ("activation", activation), ("approximate", approximate), ("stages", stages)]):
            _checks.remember_checked(key, _lowering.bound(impl))
    return impl(x, w1, b1, w3, b3, w2, b2, activation, approximate, stages, group_name)


@_fake("cta_pipeline_mlp")
def _(x, w1, b1, w3, b3, w2, b2, activation, approximate, stages, group_name, lowering):
    if activation not in CTA_ACTIVATIONS:
        raise ValueError(f"overlap::cta_pipeline_mlp: activation {activation!r}; allowed: {', '.join(CTA_ACTIVATIONS)}")
    if approximate not in GELU_APPROXIMATIONS:
        raise ValueError(
            f"overlap::cta_pipeline_mlp: approximate {approximate!r}; allowed: {', '.join(GELU_APPROXIMATIONS)}"
        )
    if (activation == "swiglu") != (w3 is not None):
        raise ValueError("overlap::cta_pipeline_mlp: w3 is given exactly when activation is 'swiglu'")
    return x.new_empty((x.shape[0], w2.shape[1]), dtype=torch.result_type(x, w1))


OPS["cta_pipeline_mlp"] = torch.ops.overlap.cta_pipeline_mlp


# ---------------------------------------------------------------------- grouped GEMM weight gradient
# grouped_mm_weight_grad(Tensor input, Tensor grad_output, Tensor offs) -> Tensor
@_define("grouped_mm_weight_grad(Tensor input, Tensor grad_output, Tensor offs) -> Tensor",
         tags=(torch.Tag.cudagraph_unsafe,))
def grouped_mm_weight_grad(input, grad_output, offs):
    """The weight gradient of a grouped GEMM over expert-major rows (expert ``e``'s rows end at ``offs[e]``):
    ``dW[e] = input[rows_e]^T @ grad_output[rows_e]``, ``[E, K, N]``, zeros for an expert without rows.

    It is the second output of ``transformers::grouped_mm_fallback_backward``, computed the same way (the
    offsets are read on the host), for backward graphs whose input gradient the ``moe`` pass takes.
    """
    if input.dim() != 2 or grad_output.dim() != 2 or offs.dim() != 1 or input.shape[0] != grad_output.shape[0]:
        raise ValueError(f"overlap::grouped_mm_weight_grad: input {tuple(input.shape)}, grad_output "
                         f"{tuple(grad_output.shape)} (both [M, *]) and offs {tuple(offs.shape)} ([E])")
    out = input.new_zeros((offs.shape[0], input.shape[1], grad_output.shape[1]))
    start = 0
    for e, end in enumerate(offs.tolist()):
        if end > start:
            torch.mm(input[start:end].t(), grad_output[start:end], out=out[e])
        start = end
    return out


@_fake("grouped_mm_weight_grad")
def _(input, grad_output, offs):
    return input.new_empty((offs.shape[0], input.shape[1], grad_output.shape[1]))


OPS["grouped_mm_weight_grad"] = torch.ops.overlap.grouped_mm_weight_grad
