"""Input validation of the ``torch.ops.overlap`` ops, run before any communication starts.

Every op body in ``ops.py`` calls its ``check_<op>`` first, for every lowering. A check reads only
what every rank of the group agrees on when the graph was rewritten by the passes (shapes, dtypes,
device types, the op's arguments, the group's size and membership), never the rank, a value of a
tensor or the timing, so a call that fails here fails on every rank at the same point and none is
left waiting in a transfer. (A direct caller that hands the ranks differently shaped tensors breaks
that; then the ranks that do start communicating get the lowering's bounded wait instead:
``P2PError`` after ``OVERLAP_TIMEOUT_S`` on ``p2p``, ``SymmTimeoutError`` on ``symm``.)

One exception: ``moe_experts``'s split sizes are per-rank values (dropless routing computes them
from the tokens, and each rank's row count follows), so its split checks (``sum(send_splits)`` =
rows of ``x``, this rank's own split sent = received) can fail on one rank only. They can only fail
when the graph's own count exchange is inconsistent; the other ranks then end in the bounded wait.

Messages name the op, the argument and what was expected::

    overlap::mm_rs: argument 'out_shape': dim 0 of [6, 16] (6) is not divisible by the group size 4

Non-contiguous tensors are accepted by every op (no layout is rejected): the lowerings copy what
they need contiguous (``ag_mm``'s shard, ``mm_rs``'s ``a`` when it is viewed N-D, the ``symm``
kernels' TMA operands) and read the rest (weights, biases) through their strides. Layout is a
rank-local property, so rejecting it could split the ranks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

REDUCE_OPS = ("sum", "avg", "product", "min", "max")


class OverlapInputError(ValueError):
    """An ``overlap::*`` op was called with an argument it cannot run on (raised before any transfer)."""


class OverlapGroupError(OverlapInputError):
    """``group_name`` does not name a process group this rank belongs to."""


def _fail(op: str, arg: str, msg: str) -> OverlapInputError:
    return OverlapInputError(f"overlap::{op}: argument {arg!r}: {msg}")


def check_no_autograd(op: str, arg_names: Sequence[str], args: tuple, kwargs: dict) -> None:
    """Raise if a tensor argument requires grad (called in grad mode only): an op has no autograd formula."""
    named = list(zip(arg_names, args)) + list(kwargs.items())
    for arg, value in named:
        for i, t in enumerate(value if isinstance(value, (list, tuple)) else (value,)):
            if isinstance(t, Tensor) and t.requires_grad:
                where = f"{arg}[{i}]" if isinstance(value, (list, tuple)) else arg
                raise _fail(op, where, "requires grad in grad mode, and the overlap ops have no autograd formula "
                            "(autograd would differentiate the local steps and miss the communication). They run "
                            "inside the graphs torch.compile(backend='overlap') builds, where AOTAutograd "
                            "differentiates the original collectives; called directly, call them under "
                            "torch.no_grad() or on detached tensors.")


def resolve_group(op: str, group_name: str):
    """The process group named ``group_name``, of which this process is a member."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    if not isinstance(group_name, str):
        raise OverlapGroupError(f"overlap::{op}: argument 'group_name': expected a str, got {type(group_name).__name__}")
    try:
        group = _resolve_process_group(group_name)
    except Exception as e:  # noqa: BLE001 - whatever c10d raises for an unknown name
        raise OverlapGroupError(
            f"overlap::{op}: argument 'group_name': {group_name!r} is not a process group of this process "
            f"(unknown or destroyed, or this rank is not a member of it; torch.distributed is "
            f"{'initialised' if torch.distributed.is_initialized() else 'not initialised'}): "
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from None
    if group.rank() < 0 or group.size() < 1:
        raise OverlapGroupError(
            f"overlap::{op}: argument 'group_name': this process is not a member of group {group_name!r}"
        )
    return group


def _desc(t: Tensor) -> str:
    return f"{list(t.shape)} {t.dtype} on {t.device.type}"


def _tensor(op: str, arg: str, t, dims: int | None = None) -> Tensor:
    if not isinstance(t, Tensor):
        raise _fail(op, arg, f"expected a tensor, got {type(t).__name__}")
    if dims is not None and t.dim() != dims:
        raise _fail(op, arg, f"expected a {dims}-D tensor, got shape {list(t.shape)}")
    return t


def _float(op: str, arg: str, t: Tensor) -> None:
    if not t.is_floating_point():
        raise _fail(op, arg, f"expected a floating-point tensor, got {t.dtype}")


def _same(op: str, arg: str, t: Tensor, ref: Tensor, ref_name: str, dtype: bool = True) -> None:
    if dtype and t.dtype != ref.dtype:
        raise _fail(op, arg, f"expected dtype {ref.dtype} (that of {ref_name!r}), got {_desc(t)}")
    if t.device.type != ref.device.type:
        raise _fail(op, arg, f"expected a {ref.device.type} tensor (like {ref_name!r}), got {_desc(t)}")


def _bias(op: str, arg: str, bias, n: int, ref: Tensor, ref_name: str) -> None:
    if bias is None:
        return
    _tensor(op, arg, bias)
    if tuple(bias.shape) != (n,):
        raise _fail(op, arg, f"expected a [{n}] vector (one value per output column), got shape {list(bias.shape)}")
    _same(op, arg, bias, ref, ref_name)


def _dim(op: str, arg: str, d, ndim: int) -> int:
    if isinstance(d, bool) or not isinstance(d, int):
        raise _fail(op, arg, f"expected an int, got {type(d).__name__}")
    if not -ndim <= d < ndim:
        raise _fail(op, arg, f"{d} is out of range for {ndim} dims (expected {-ndim} <= dim < {ndim})")
    return d % ndim


def _reduce_op(op: str, reduce_op) -> None:
    if reduce_op not in REDUCE_OPS:
        raise _fail(op, "reduce_op", f"{reduce_op!r} is not supported; allowed: {', '.join(REDUCE_OPS)}")


def _matmul(op: str, a, b, bias) -> None:
    """``a`` [M, K] @ ``b`` [K, N] (+ ``bias`` [N]), one floating dtype, one device type."""
    _tensor(op, "a", a, 2)
    _tensor(op, "b", b, 2)
    _float(op, "a", a)
    _same(op, "b", b, a, "a")
    if a.shape[1] != b.shape[0]:
        raise _fail(op, "b", f"expected [K={a.shape[1]}, N] to multiply a {list(a.shape)}, got shape {list(b.shape)}")
    _bias(op, "bias", bias, b.shape[1], a, "a")


# ------------------------------------------------------------------------------------ the ops
def check_ag_mm(shard, weights, biases, gather_dim, group) -> int:
    """Returns the gather dim, normalised."""
    op = "ag_mm"
    _tensor(op, "shard", shard)
    if shard.dim() < 1:
        raise _fail(op, "shard", "expected at least 1 dim, got a 0-d tensor")
    _float(op, "shard", shard)
    dim = _dim(op, "gather_dim", gather_dim, shard.dim())
    k = shard.shape[-1] * (group.size() if dim == shard.dim() - 1 else 1)
    if not isinstance(weights, (list, tuple)) or not weights:
        raise _fail(op, "weights", "expected a non-empty list of [K, N] matrices")
    for i, w in enumerate(weights):
        arg = f"weights[{i}]"
        _tensor(op, arg, w, 2)
        _same(op, arg, w, shard, "shard")
        if w.shape[0] != k:
            raise _fail(op, arg, f"expected [K={k}, N] (K = the gathered tensor's last dim), got shape {list(w.shape)}")
    if biases and len(biases) != len(weights):
        raise _fail(op, "biases", f"expected one entry (a tensor or None) per weight ({len(weights)}), got {len(biases)}")
    for i, b in enumerate(biases or ()):
        _bias(op, f"biases[{i}]", b, weights[i].shape[1], shard, "shard")
    return dim


def check_mm_rs(a, b, bias, out_shape, scatter_dim, reduce_op, group) -> None:
    op = "mm_rs"
    _matmul(op, a, b, bias)
    _reduce_op(op, reduce_op)
    shape = [int(s) for s in out_shape]
    if not shape or math.prod(shape[:-1]) != a.shape[0] or shape[-1] != b.shape[1]:
        raise _fail(op, "out_shape", f"expected a shape [..., N={b.shape[1]}] whose leading dims multiply to "
                    f"M={a.shape[0]} (the rows of a @ b), got {shape}")
    dim = _dim(op, "scatter_dim", scatter_dim, len(shape))
    ws = group.size()
    if shape[dim] % ws:
        raise _fail(op, "out_shape", f"dim {dim} of {shape} ({shape[dim]}) is not divisible by the group size {ws} "
                    f"(scatter_dim={scatter_dim})")


def check_mm_ar(a, b, bias, reduce_op) -> None:
    op = "mm_ar"
    _matmul(op, a, b, bias)
    _reduce_op(op, reduce_op)


def _moe_rows(op: str, name: str, x, send_splits, recv_splits, rows, group) -> None:
    """The all-to-all side of a MoE op: ``x`` (``name``) ``[N_send, H]``, one split per rank, ``rows``."""
    ws, rank = group.size(), group.rank()
    _tensor(op, name, x, 2)
    _float(op, name, x)
    _tensor(op, "rows", rows, 1)
    if rows.is_floating_point() or rows.dtype == torch.bool:
        raise _fail(op, "rows", f"expected an integer index tensor, got {rows.dtype}")
    for arg, splits in (("send_splits", send_splits), ("recv_splits", recv_splits)):
        if len(splits) != ws:
            raise _fail(op, arg, f"expected {ws} sizes (one per rank of the group), got {len(splits)}")
        if any(int(s) < 0 for s in splits):
            raise _fail(op, arg, f"negative split size in {[int(s) for s in splits]}")
    if sum(int(s) for s in send_splits) != x.shape[0]:
        raise _fail(op, "send_splits", f"{[int(s) for s in send_splits]} do not add up to the {x.shape[0]} rows of {name}")
    if int(send_splits[rank]) != int(recv_splits[rank]):
        raise _fail(op, "recv_splits", f"rank {rank} sends itself {int(send_splits[rank])} rows but receives "
                    f"{int(recv_splits[rank])}")


def _moe_weights(op: str, names: tuple[str, str, str], first, second, last, wide: bool) -> tuple[int, int, int]:
    """Three expert weights of one dtype: ``[E, A, B]``, ``[E, A, B]``, ``[E, B, A]``; returns ``(E, H, F)``
    (``wide``: ``A`` is H, the forward's; else F, the backward's transposed weights)."""
    _tensor(op, names[0], first, 3)
    _float(op, names[0], first)
    e, a, b = first.shape
    for name, w, want in ((names[1], second, (e, a, b)), (names[2], last, (e, b, a))):
        _tensor(op, name, w, 3)
        if tuple(w.shape) != want:
            raise _fail(op, name, f"expected shape {list(want)} ({names[0]} is {list(first.shape)}), got {list(w.shape)}")
        _same(op, name, w, first, names[0])
    return (e, a, b) if wide else (e, b, a)


def _moe_groups(op: str, offsets, group_sizes, e: int) -> None:
    if offsets is None:
        if len(group_sizes) != e:
            raise _fail(op, "group_sizes", f"expected {e} sizes (one per expert) when offsets is None, got {len(group_sizes)}")
    else:
        _tensor(op, "offsets", offsets, 1)
        if offsets.shape[0] != e or offsets.is_floating_point():
            raise _fail(op, "offsets", f"expected [{e}] integer cumulative ends, got {_desc(offsets)}")


def check_moe_experts(x, send_splits, recv_splits, rows, offsets, group_sizes, w_gate, w_up, w_down,
                      saved: Sequence[bool], group, saved_names: Sequence[str], comm_sms: int = -1) -> None:
    op = "moe_experts"
    from ..config import MOE_COMM_SMS_MAX

    # (a comm kernel holding most SMs would leave the GEMMs it spins on too few to finish in time)
    if not -1 <= comm_sms <= MOE_COMM_SMS_MAX:
        raise _fail(op, "comm_sms", f"expected -1 (the OVERLAP_MOE_COMM_SMS setting), 0 (no comm kernel) or up to "
                    f"{MOE_COMM_SMS_MAX} SMs, got {comm_sms}")
    _moe_rows(op, "x", x, send_splits, recv_splits, rows, group)
    e, h, f = _moe_weights(op, ("w_gate", "w_up", "w_down"), w_gate, w_up, w_down, wide=True)
    if h != x.shape[1]:
        raise _fail(op, "w_gate", f"expected [E, H={x.shape[1]}, F] (H = the width of x's rows), got {list(w_gate.shape)}")
    _same(op, "w_gate", w_gate, x, "x", dtype=False)
    _moe_groups(op, offsets, group_sizes, e)
    if len(saved) != len(saved_names):
        raise _fail(op, "saved", f"expected {len(saved_names)} flags {tuple(saved_names)}, got {len(saved)}")


def check_moe_experts_backward(grad, send_splits, recv_splits, rows, offsets, group_sizes, gate, up, wt_gate, wt_up,
                               wt_down, group) -> None:
    op = "moe_experts_backward"
    _moe_rows(op, "grad", grad, send_splits, recv_splits, rows, group)
    e, h, f = _moe_weights(op, ("wt_gate", "wt_up", "wt_down"), wt_gate, wt_up, wt_down, wide=False)
    if h != grad.shape[1]:
        raise _fail(op, "wt_gate", f"expected [E, F, H={grad.shape[1]}] (H = the width of grad's rows), got "
                    f"{list(wt_gate.shape)}")
    _same(op, "wt_gate", wt_gate, grad, "grad", dtype=False)
    for name, t in (("gate", gate), ("up", up)):
        _tensor(op, name, t, 2)
        if tuple(t.shape) != (rows.shape[0], f):
            raise _fail(op, name, f"expected [M={rows.shape[0]}, F={f}] (a row per grouped row), got {list(t.shape)}")
        _same(op, name, t, wt_gate, "wt_gate")
    _moe_groups(op, offsets, group_sizes, e)


def check_cta_pipeline_mlp(x, w1, b1, w3, b3, w2, b2, activation, approximate, stages,
                           activations: Sequence[str], approximations: Sequence[str]) -> None:
    op = "cta_pipeline_mlp"
    if activation not in activations:
        raise _fail(op, "activation", f"{activation!r}; allowed: {', '.join(activations)}")
    if approximate not in approximations or (activation == "swiglu" and approximate != "none"):
        allowed = ("none",) if activation == "swiglu" else approximations
        raise _fail(op, "approximate", f"{approximate!r} with activation {activation!r}; allowed: {', '.join(allowed)}")
    if (activation == "swiglu") != (w3 is not None):
        raise _fail(op, "w3", "expected a tensor exactly when activation is 'swiglu'"
                    f" (activation {activation!r}, w3 {'given' if w3 is not None else 'None'})")
    if (w3 is None) and b3 is not None:
        raise _fail(op, "b3", "given without w3")
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise _fail(op, "stages", f"expected an integer >= 1, got {stages!r}")
    _tensor(op, "x", x, 2)
    _float(op, "x", x)
    m, h = x.shape
    _tensor(op, "w1", w1, 2)
    _same(op, "w1", w1, x, "x")
    if w1.shape[0] != h:
        raise _fail(op, "w1", f"expected [H={h}, F] (H = x's last dim), got shape {list(w1.shape)}")
    f = w1.shape[1]
    _bias(op, "b1", b1, f, x, "x")
    if w3 is not None:
        _tensor(op, "w3", w3, 2)
        _same(op, "w3", w3, x, "x")
        if tuple(w3.shape) != tuple(w1.shape):
            raise _fail(op, "w3", f"expected the shape of w1 {list(w1.shape)}, got {list(w3.shape)}")
        _bias(op, "b3", b3, f, x, "x")
    _tensor(op, "w2", w2, 2)
    _same(op, "w2", w2, x, "x")
    if w2.shape[0] != f:
        raise _fail(op, "w2", f"expected [F={f}, N] (F = w1's columns), got shape {list(w2.shape)}")
    _bias(op, "b2", b2, w2.shape[1], x, "x")


# ------------------------------------------------------------------------- rank agreement
class OverlapDisagreementError(OverlapInputError):
    """The ranks of the group called an op with different shapes or dtypes (found before any transfer)."""


_AGREED: set[tuple] = set()  # (op, group name, key) checked once; the steady state pays nothing


class RowWidth(tuple):
    """What the ranks must agree on of a tensor whose row count is theirs alone: its width and dtype."""

    def __repr__(self) -> str:
        return f"[*, {self[0]}] {self[1]}"


def row_width(t: Tensor) -> RowWidth:
    """``t``'s row width and dtype (a MoE op's token rows: their count differs per rank by design)."""
    return RowWidth((t.shape[-1], t.dtype))


def _arg_key(value):
    """What the agreement is keyed by, cheap to build on every call (no strings)."""
    if isinstance(value, Tensor):
        return (tuple(value.shape), value.dtype)
    if isinstance(value, (list, tuple)):
        return tuple(_arg_key(v) for v in value)
    return value


def _arg_signature(value) -> str:
    if isinstance(value, RowWidth):
        return repr(value)
    if isinstance(value, Tensor):
        return f"{list(value.shape)} {value.dtype}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_arg_signature(v) for v in value) + "]"
    return repr(value)


def check_agreement(op: str, group, named_args: Sequence[tuple[str, object]]) -> bool:
    """On the first call of a (op, group, shapes/dtypes) key: all-gather one stable hash per argument
    over ``group`` and raise :class:`OverlapDisagreementError`, naming the op and the arguments that
    differ, on every rank where any rank differs. Values that are the same on every rank of an SPMD
    program (shapes, dtypes, the op's scalars) are the key; never a tensor's contents. Returns whether the
    ranks agreed (False: not checked yet, inside a CUDA-graph capture)."""
    import zlib

    import torch.distributed as dist

    key = (op, group.group_name, tuple(_arg_key(v) for _, v in named_args))
    if key in _AGREED:
        return True
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return False  # no collective inside a capture: the warm-up call of this key (eager) is where it is checked
    signatures = [(name, _arg_signature(v)) for name, v in named_args]
    ws = group.size()
    if ws > 1:
        hashes = [zlib.crc32(f"{name}={sig}".encode()) for name, sig in signatures]
        device = next((v.device for _, v in named_args if isinstance(v, Tensor)), torch.device("cpu"))
        if "gloo" in str(dist.get_backend(group)).lower() and "cuda:" not in str(dist.get_backend(group)).lower():
            device = torch.device("cpu")  # gloo gathers CPU tensors
        mine = torch.tensor(hashes, dtype=torch.int64, device=device)
        gathered = torch.empty((ws * len(hashes),), dtype=torch.int64, device=device)
        from .p2p import P2PError, all_gather_single, group_state

        state = group_state(group.group_name)
        try:  # bounded like the lowerings' transfers: a late or dead peer is a P2PError
            work = all_gather_single(gathered, mine, group=group, async_op=True)
            work.wait() if mine.is_cuda else work.wait(state.timeout)
        except RuntimeError as e:
            raise P2PError(
                f"overlap p2p: {op} on rank {group.rank()} of group {group.group_name!r}: the ranks' agreement check "
                f"on the op's shapes and dtypes failed or did not finish within OVERLAP_TIMEOUT_S="
                f"{state.timeout_s:g} s. A peer died, skipped the op call or is far behind. Cause: "
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            ) from e
        rows = gathered.view(ws, len(hashes)).cpu().tolist()
        differs = [name for i, (name, _) in enumerate(signatures) if len({row[i] for row in rows}) > 1]
        if differs:
            ranks = [r for r, row in enumerate(rows) if row != rows[0]]
            raise OverlapDisagreementError(
                f"overlap::{op}: the ranks of group {group.group_name!r} disagree on argument(s) "
                f"{', '.join(repr(d) for d in differs)} (shapes or dtypes; ranks {ranks} differ from rank 0); "
                f"this rank has {', '.join(f'{n}: {s}' for n, s in signatures if n in differs)}. Every rank "
                f"must call the op with the same shapes and dtypes."
            )
    _AGREED.add(key)
    return True


# ------------------------------------------------------------------------ checked calls
CHECKED: dict[tuple, tuple] = {}  # an op call's argument key -> what its checks found (runtime/ops.py)
CHECKED_MAX = 4096  # keys kept (dynamic shapes make one per length); past it the cache starts over


def tensor_key(t):
    """What an op's checks read of a tensor (or None): dtype, shape, strides, device; never its contents."""
    return None if t is None else (t.dtype, t.shape, t.stride(), t.get_device())


def tensors_key(ts):
    # tensor_key inlined: this runs for every tensor argument of every call
    return tuple([None if t is None else (t.dtype, t.shape, t.stride(), t.get_device()) for t in ts])


def remember_checked(key: tuple, found: tuple) -> tuple:
    if len(CHECKED) >= CHECKED_MAX:
        CHECKED.clear()
    CHECKED[key] = found
    return found


def forget_checked() -> None:
    """Process groups were destroyed: their names may come back for other groups."""
    CHECKED.clear()
    _AGREED.clear()
