"""Reference expert-parallel MoE layer, written the way users write them.

One layer per rank of ``group`` (expert parallelism: each rank owns ``num_experts / ws`` experts and
routes its own tokens)::

    router + top-k  →  token permutation  →  dispatch all_to_all_single
        →  local experts (SwiGLU)  →  combine all_to_all_single  →  weighted sum over the top-k

The collectives are functional collectives (``torch.distributed._functional_collectives``), which
Dynamo traces into ``_c10d_functional.all_to_all_single`` + ``wait_tensor`` and which propagate
gradients (in torch 2.13 ``all_to_all_single`` has autograd; older releases need the
``*_autograd`` variant, taken below when it is the only one that does).

Two token policies:

- ``"capacity"`` (GShard): every expert takes at most ``capacity`` tokens from each source rank;
  the dispatch buffer is ``[num_experts, capacity, hidden]`` with zero rows where an expert got
  fewer tokens, and the tokens past the capacity are dropped (they contribute zero). All shapes are
  static.
- ``"dropless"``: every token reaches its experts. The split sizes of the all-to-all depend on the
  routing: the per-expert token counts are exchanged first (a small ``all_to_all_single``), then
  ``.tolist()`` turns them into split sizes. Under ``torch.compile`` this needs
  ``torch._dynamo.config.capture_scalar_outputs = True`` (or ``fullgraph=True``): the sizes become
  unbacked SymInts, one graph for every routing. Otherwise ``.tolist()`` breaks the graph and the
  graph after it bakes the sizes in: every new routing recompiles. The layer states what the
  compiler cannot infer about the sizes with ``torch._check``, so no other setting is needed.
  See ``docs/moe.md``.

Three forms of the expert GEMMs (``expert_form``), which the ``moe`` pass recognises:

- ``"grouped_mm"``: ``torch._grouped_mm(x, w, offs=...)`` over expert-major rows (runs on CPU in
  torch 2.13 for float32; bfloat16 on CPU needs 16-byte-aligned strides);
- ``"bmm"``: ``torch.bmm`` over ``[local_experts, rows, hidden]``; capacity: the capacity layout
  itself, dropless: each expert's rows padded to the fixed upper bound ``ws * tokens`` (an expert
  receives at most one copy of each token: the top-k experts of a token are distinct);
- ``"loop"``: a Python loop over the local experts, two ``mm`` and a ``mm`` each.

``fused_gate_up`` stores gate and up as one weight and runs them as one GEMM whose output is split
in two halves (``.chunk(2, -1)``, or slices with ``gate_up_split="slice"``), as transformers 5 and
vLLM store experts: ``"gate_up"`` puts the gate columns first, ``"up_gate"`` the up columns.
``linear_weights=True`` stores the weights transposed (``w_gate_up [E, 2F, H]``, ``w_down [E, H, F]``,
transformers' layout) and applies them as ``F.linear`` does (``x @ W^T``); the default layout is
``[E, H, 2F]`` / ``[E, F, H]``. The weights are the separate layer's, concatenated: the fused
layer computes what the separate one does.

Every rank draws the FULL weights from one generator seeded with ``seed`` and keeps its experts, so
the layer is identical on every rank and from run to run, whatever the world size.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import nn

from .tp import FullInit, group_info

POLICIES = ("capacity", "dropless")
EXPERT_FORMS = ("grouped_mm", "bmm", "loop")
FUSED_GATE_UP = (None, "gate_up", "up_gate")

# torch 2.13's all_to_all_single has autograd; older releases only through the *_autograd name.
_all_to_all = getattr(funcol, "all_to_all_single_autograd", None) or funcol.all_to_all_single


def has_grouped_mm() -> bool:
    """``torch._grouped_mm`` exists in this torch build (it runs on CPU from torch 2.9 on)."""
    return hasattr(torch, "_grouped_mm")


def swiglu(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """One expert: ``(silu(x @ w_gate) * (x @ w_up)) @ w_down``; ``x [n, H]``, ``w_gate/w_up [H, F]``,
    ``w_down [F, H]``."""
    return (F.silu(x @ w_gate) * (x @ w_up)) @ w_down


def grouped_swiglu(x: torch.Tensor, w_gate, w_up, w_down, offs: torch.Tensor) -> torch.Tensor:
    """Expert ``e`` on rows ``offs[e-1]:offs[e]`` of ``x`` (expert-major), as one grouped GEMM each.

    ``torch._grouped_mm`` takes bfloat16 only (its meta function, i.e. under ``torch.compile``,
    on every device): the GEMMs run in bfloat16 and the result is cast back, as torchtitan does.
    """
    bf16 = torch.bfloat16
    xb = x.to(bf16)
    h = F.silu(torch._grouped_mm(xb, w_gate.to(bf16), offs=offs)) * torch._grouped_mm(xb, w_up.to(bf16), offs=offs)
    return torch._grouped_mm(h, w_down.to(bf16), offs=offs).to(x.dtype)


def bmm_swiglu(x: torch.Tensor, w_gate, w_up, w_down) -> torch.Tensor:
    """``x [E, n, H]``: expert ``e`` on ``x[e]``."""
    return torch.bmm(F.silu(torch.bmm(x, w_gate)) * torch.bmm(x, w_up), w_down)


class MoELayer(nn.Module):
    """Expert-parallel MoE layer (router, top-k, all-to-all dispatch, SwiGLU experts, combine).

    Input and output ``[..., hidden]``: this rank's tokens (any leading shape). The router
    (``[hidden, num_experts]``) is replicated; rank ``r`` holds experts
    ``r * E_local ... (r + 1) * E_local - 1`` as ``w_gate``/``w_up`` ``[E_local, hidden, ffn]`` and
    ``w_down`` ``[E_local, ffn, hidden]``. Routing: softmax over the experts, top-k, the k weights
    renormalised to sum to one.

    ``capacity`` (capacity policy): tokens each expert takes from each rank; default
    ``ceil(capacity_factor * tokens * top_k / num_experts)``.
    """

    def __init__(
        self,
        hidden: int,
        ffn: int,
        num_experts: int,
        top_k: int = 2,
        *,
        group: dist.ProcessGroup | None = None,
        policy: str = "capacity",
        expert_form: str = "grouped_mm",
        capacity_factor: float = 1.25,
        capacity: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        seed: int = 0,
        fused_gate_up: str | None = None,
        linear_weights: bool = False,
        gate_up_split: str = "chunk",
    ):
        super().__init__()
        if policy not in POLICIES:
            raise ValueError(f"policy={policy!r}; allowed: {', '.join(POLICIES)}")
        if expert_form not in EXPERT_FORMS:
            raise ValueError(f"expert_form={expert_form!r}; allowed: {', '.join(EXPERT_FORMS)}")
        if fused_gate_up not in FUSED_GATE_UP:
            raise ValueError(f"fused_gate_up={fused_gate_up!r}; allowed: {FUSED_GATE_UP}")
        if linear_weights and fused_gate_up is None:
            raise ValueError("linear_weights=True needs fused_gate_up (transformers' fused layout)")
        if gate_up_split not in ("chunk", "slice"):
            raise ValueError(f"gate_up_split={gate_up_split!r}; allowed: 'chunk', 'slice'")
        if expert_form == "grouped_mm" and not has_grouped_mm():
            raise ValueError("expert_form='grouped_mm' needs torch._grouped_mm, which this torch lacks")
        self.group, rank, ws = group_info(group)
        if num_experts % ws:
            raise ValueError(f"num_experts {num_experts} is not divisible by the world size {ws}")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k {top_k} must be in [1, num_experts={num_experts}]")
        self.ws, self.num_experts, self.top_k = ws, num_experts, top_k
        self.local_experts = num_experts // ws
        self.policy, self.expert_form = policy, expert_form
        self.capacity_factor, self.capacity = capacity_factor, capacity
        init = FullInit(seed, dtype, device)
        lo, hi = rank * self.local_experts, (rank + 1) * self.local_experts
        self.router = nn.Parameter(init.linear(hidden, hidden, num_experts))
        w_gate = init.linear(hidden, num_experts, hidden, ffn)[lo:hi]
        w_up = init.linear(hidden, num_experts, hidden, ffn)[lo:hi]
        w_down = init.linear(ffn, num_experts, ffn, hidden)[lo:hi]
        self.fused_gate_up, self.linear_weights, self.gate_up_split = fused_gate_up, linear_weights, gate_up_split
        if fused_gate_up is None:
            self.w_gate = nn.Parameter(w_gate.contiguous())
            self.w_up = nn.Parameter(w_up.contiguous())
            self.w_down = nn.Parameter(w_down.contiguous())
        else:
            halves = (w_gate, w_up) if fused_gate_up == "gate_up" else (w_up, w_gate)
            fused = torch.cat(halves, dim=-1)  # [E, H, 2F]
            self.w_gate_up = nn.Parameter((fused.transpose(1, 2) if linear_weights else fused).contiguous())
            self.w_down = nn.Parameter((w_down.transpose(1, 2) if linear_weights else w_down).contiguous())

    # ------------------------------------------------------------------------------ routing
    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k expert ids ``[T, k]`` and their weights ``[T, k]`` (renormalised, ``x.dtype``)."""
        probs = torch.softmax((x @ self.router).float(), dim=-1)
        weights, experts = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return experts, weights.to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        experts, weights = self.route(x)
        t, k = experts.shape
        flat = experts.reshape(-1)  # [T*k] global expert of each (token, slot)
        x_rep = x.unsqueeze(1).expand(t, k, x.shape[-1]).reshape(t * k, x.shape[-1])
        if self.policy == "capacity":
            out_rep = self._capacity(x_rep, flat, t)
        else:
            out_rep = self._dropless(x_rep, flat, t)
        y = (out_rep.view(t, k, -1) * weights.unsqueeze(-1)).sum(dim=1)
        return y.reshape(shape)

    # --------------------------------------------------------------------- capacity policy
    def _capacity(self, x_rep: torch.Tensor, flat: torch.Tensor, tokens: int) -> torch.Tensor:
        ws, el, e, h = self.ws, self.local_experts, self.num_experts, x_rep.shape[-1]
        cap = self.capacity or max(1, math.ceil(self.capacity_factor * tokens * self.top_k / e))
        # Position of each assignment among those of its expert; beyond the capacity: dropped
        # (sent to a spare row that is never dispatched).
        one_hot = F.one_hot(flat, e)
        pos = ((one_hot.cumsum(0) - 1) * one_hot).sum(-1)
        slot = torch.where(pos < cap, flat * cap + pos, e * cap)
        buf = x_rep.new_zeros(e * cap + 1, h).index_put((slot,), x_rep, accumulate=True)[: e * cap]

        recv = _all_to_all(buf, None, None, self.group)  # [ws(source), E_local, cap, H]
        xe = recv.view(ws, el, cap, h).transpose(0, 1).reshape(el, ws * cap, h)
        ye = self._experts_padded(xe)  # [E_local, ws*cap, H]
        back = ye.view(el, ws, cap, h).transpose(0, 1).reshape(ws * el * cap, h)
        combined = _all_to_all(back, None, None, self.group)  # [E, cap, H]: this rank's tokens

        combined = torch.cat([combined, combined.new_zeros(1, h)])  # dropped tokens read zeros
        return combined[slot]

    def _experts_padded(self, xe: torch.Tensor) -> torch.Tensor:
        """SwiGLU of expert e on ``xe[e]`` (``[E_local, n, H]``), in the configured form."""
        el, n, h = xe.shape
        if self.expert_form == "bmm":
            return self._bmm_experts(xe)
        if self.expert_form == "grouped_mm":
            offs = torch.arange(1, el + 1, device=xe.device, dtype=torch.int32) * n
            return self._grouped_experts(xe.reshape(el * n, h), offs).view(el, n, h)
        return torch.stack([self._one_expert(xe[i], i) for i in range(el)])

    # ------------------------------------------------------------------ the expert GEMMs
    def _act(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(G) * U`` from the fused GEMM's output ``[..., 2F]``."""
        if self.gate_up_split == "chunk":
            first, second = gate_up.chunk(2, dim=-1)
        else:
            f = gate_up.shape[-1] // 2
            first, second = gate_up[..., :f], gate_up[..., f:]
        g, u = (first, second) if self.fused_gate_up == "gate_up" else (second, first)
        return F.silu(g) * u

    def _stacked_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Fused: ``[E, H, 2F]`` and ``[E, F, H]`` as the GEMMs read them (views for ``linear_weights``)."""
        if self.linear_weights:
            return self.w_gate_up.transpose(1, 2), self.w_down.transpose(1, 2)
        return self.w_gate_up, self.w_down

    def _bmm_experts(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_gate_up is None:
            return bmm_swiglu(x, self.w_gate, self.w_up, self.w_down)
        w_gu, w_down = self._stacked_weights()
        return torch.bmm(self._act(torch.bmm(x, w_gu)), w_down)

    def _grouped_experts(self, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        if self.fused_gate_up is None:
            return grouped_swiglu(x, self.w_gate, self.w_up, self.w_down, offs)
        bf16 = torch.bfloat16  # (see grouped_swiglu)
        w_gu, w_down = self._stacked_weights()
        a = self._act(torch._grouped_mm(x.to(bf16), w_gu.to(bf16), offs=offs))
        return torch._grouped_mm(a, w_down.to(bf16), offs=offs).to(x.dtype)

    def _one_expert(self, x: torch.Tensor, i: int) -> torch.Tensor:
        if self.fused_gate_up is None:
            return swiglu(x, self.w_gate[i], self.w_up[i], self.w_down[i])
        if self.linear_weights:  # transformers' eager experts
            return F.linear(self._act(F.linear(x, self.w_gate_up[i])), self.w_down[i])
        return self._act(x @ self.w_gate_up[i]) @ self.w_down[i]

    # --------------------------------------------------------------------- dropless policy
    def _dropless(self, x_rep: torch.Tensor, flat: torch.Tensor, tokens: int) -> torch.Tensor:
        ws, el, e, h = self.ws, self.local_experts, self.num_experts, x_rep.shape[-1]
        # Assignments sorted by global expert = by destination rank, then by its local expert.
        order = torch.argsort(flat, stable=True)
        x_sorted = x_rep[order]
        counts = F.one_hot(flat, e).sum(0)  # [E] tokens of this rank per global expert
        # counts_recv[s * E_local + j]: tokens rank s sends to my local expert j.
        counts_recv = funcol.all_to_all_single(counts, None, None, self.group)
        send_splits = counts.view(ws, el).sum(1).tolist()
        recv_splits = counts_recv.view(ws, el).sum(1).tolist()
        for s in send_splits + recv_splits:
            torch._check(s >= 0)
            torch._check(s <= tokens * self.top_k)
        torch._check(sum(send_splits) == x_sorted.shape[0])
        recv = _all_to_all(x_sorted, recv_splits, send_splits, self.group)  # [N_recv, H] source-major
        n_recv = recv.shape[0]

        # Regroup the received rows expert-major (stable: source order within an expert).
        local = torch.arange(el, device=flat.device).repeat(ws)
        row_expert = torch.repeat_interleave(local, counts_recv, output_size=n_recv)
        perm = torch.argsort(row_expert, stable=True)
        per_expert = counts_recv.view(ws, el).sum(0)  # [E_local]
        xg = recv[perm]
        if self.expert_form == "grouped_mm":
            offs = per_expert.cumsum(0).to(torch.int32)
            yg = self._grouped_experts(xg, offs)
        elif self.expert_form == "loop":
            sizes = per_expert.tolist()
            for s in sizes:
                torch._check(s >= 0)
            torch._check(sum(sizes) == n_recv)
            pieces = xg.split(sizes)
            yg = torch.cat([self._one_expert(p, i) for i, p in enumerate(pieces)])
        else:
            # Pad every expert's rows to the fixed bound ws * tokens (static shapes for bmm).
            bound = ws * tokens
            starts = per_expert.cumsum(0) - per_expert
            expert_sorted = row_expert[perm]
            slot = torch.arange(n_recv, device=flat.device) - starts[expert_sorted]
            xp = xg.new_zeros(el, bound, h).index_put((expert_sorted, slot), xg)
            yg = self._bmm_experts(xp)[expert_sorted, slot]
        y_recv = torch.empty_like(yg)
        y_recv[perm] = yg
        out_sorted = _all_to_all(y_recv, send_splits, recv_splits, self.group)  # [T*k, H]
        out_rep = torch.empty_like(out_sorted)
        out_rep[order] = out_sorted
        return out_rep


__all__ = ["MoELayer", "POLICIES", "EXPERT_FORMS", "FUSED_GATE_UP", "has_grouped_mm", "swiglu", "grouped_swiglu", "bmm_swiglu"]
