"""The layout proof of a MoE match: the row moves after the experts undo those before them.

Index moves pair up (a gather by ``P`` with a scatter by the same ``P`` node; a scatter by ``(e, slot)``
with a gather by the same nodes); the static view/permute moves between them are checked to compose to
the identity by running them on concrete row ids. Whatever the index values are, the op then computes
exactly what the graph did (up to the cases where the graph's own result is undefined: duplicate
scatter indices, rows of an ``empty`` no index writes).
"""

from __future__ import annotations

import math

import torch
import torch.fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..saved import saved_zeros
from .structure import FILLS, MoeMatch, Step, describe_node, is_static, is_zero_fill, shape_eq, shape_of, size_eq


def _keeps_rows(step: Step) -> str | None:
    """Why ``step`` does not move whole rows (the last dim stays the row's width), or None."""
    src, out = shape_of(step.src), shape_of(step.node)
    if step.kind in ("view",):
        if not src or not out or not size_eq(src[-1], out[-1]):
            return f"{step.node.name} reshapes {src} -> {out}: the row width changes"
    elif step.kind == "permute":
        dims = list(step.node.args[1])
        if dims[-1] % len(dims) != len(dims) - 1:
            return f"{step.node.name} permutes the row width away from the last dim"
    elif step.kind in ("gather", "scatter"):
        index = step.index
        if not index or any(not isinstance(i, torch.fx.Node) for i in index):
            return f"{step.node.name} indexes with {index} (only index tensors on the leading dims are understood)"
        ishapes = [shape_of(i) for i in index]
        if any(len(sh) != 1 or not shape_eq(sh, ishapes[0]) for sh in ishapes):
            return f"{step.node.name} indexes with tensors of shapes {ishapes} (only equal 1-D ones)"
        moved = step.base if step.kind == "scatter" else step.src
        if len(index) >= len(shape_of(moved)):
            return f"{step.node.name} indexes into the row width"
        if step.kind == "scatter" and step.base.target not in FILLS and not saved_zeros(step.base):
            return f"{step.node.name} scatters into {describe_node(step.base)}, not a fresh tensor"
    return None


def _replay(steps: list[Step], ids: torch.Tensor) -> torch.Tensor:
    """Run static view/permute/clone/cast steps on concrete row ids (last dim 1)."""
    for s in steps:
        if s.kind == "view":
            ids = ids.reshape(list(shape_of(s.node)[:-1]) + [1])
        elif s.kind == "permute":
            ids = ids.permute(list(s.node.args[1]))
    return ids


def _segments(steps: list[Step]) -> tuple[list[list[Step]], list[Step]]:
    segs, idx, cur = [], [], []
    for s in steps:
        if s.kind in ("gather", "scatter"):
            segs.append(cur)
            idx.append(s)
            cur = []
        elif s.kind != "cast":
            cur.append(s)
    segs.append(cur)
    return segs, idx


def _noop(s: Step) -> bool:
    if s.kind == "clone":
        return True
    if s.kind == "permute":
        return list(s.node.args[1]) == list(range(len(s.node.args[1])))
    return shape_eq(shape_of(s.src), shape_of(s.node))


def layout_error(m: MoeMatch) -> str | None:
    """Why the moves after the experts do not undo the moves before them, or None."""
    for s in m.in_steps + m.out_steps:
        if err := _keeps_rows(s):
            return err
        if s.kind == "scatter" and s in m.in_steps and not (is_zero_fill(s.base) or saved_zeros(s.base)):
            return f"{s.node.name}: the padded expert input is not zero-filled"
    in_segs, in_idx = _segments(m.in_steps)
    out_segs, out_idx = _segments(m.out_steps)
    if len(in_idx) != len(out_idx):
        return f"{len(in_idx)} index moves before the experts but {len(out_idx)} after them"
    k = len(in_idx)
    for i, a in enumerate(in_idx):
        b = out_idx[k - 1 - i]
        if {a.kind, b.kind} != {"gather", "scatter"} or len(a.index) != len(b.index) or any(
            x is not y for x, y in zip(a.index, b.index)
        ):
            return f"{b.node.name} does not undo {a.node.name} (a gather and a scatter by the same index nodes)"
    # Segment i before the experts is undone by segment k - i after them.
    entering = [m.dispatch.wait] + [s.node for s in in_idx]
    for i in range(k + 1):
        seg_in, seg_out = in_segs[i], out_segs[k - i]
        start = shape_of(entering[i])
        shapes = [start] + [shape_of(s.node) for s in seg_in + seg_out]
        if not all(is_static(sh) for sh in shapes):
            if not all(_noop(s) for s in seg_in + seg_out):
                return "row moves with symbolic shapes between the index moves (only no-op views are understood)"
            continue
        with unset_fake_temporarily():  # concrete ids, also when called under the graph's fake mode
            err = _segment_error(m, i, k, start, seg_in, seg_out, out_idx)
        if err:
            return err
    return None


def _segment_error(m, i, k, start, seg_in, seg_out, out_idx) -> str | None:
    """Does segment ``i`` before the experts, then segment ``k - i`` after them, give back the rows
    that entered it? (Between them, the inner index moves and the experts keep each row in place.)"""
    ids = torch.arange(math.prod(start[:-1])).reshape(list(start[:-1]) + [1])
    moved = _replay(seg_in, ids)
    # where segment k - i starts: the experts' output, or the index move that undoes in_idx[i]
    resume = m.out_node if i == k else out_idx[k - 1 - i].node
    resume_shape = list(shape_of(resume)[:-1])
    if moved.numel() != math.prod(resume_shape):
        return f"{resume.name} holds {math.prod(resume_shape)} rows where {moved.numel()} went in"
    back = _replay(seg_out, moved.reshape(resume_shape + [1]))
    if tuple(back.shape) != tuple(ids.shape) or not torch.equal(back, ids):
        names = [s.node.name for s in seg_in + seg_out]
        return f"the row moves {names} after the experts do not undo those before them"
    return None
