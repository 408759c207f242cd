"""passes/saved.py: a forward graph's zero-fill saved values are known as zeros in its backward graph."""

import torch
from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
from torch._dynamo.backends.common import aot_autograd
from torch._inductor.decomposition import select_decomp_table

from overlap_backend.passes.saved import record_forward, saved_zeros


def test_backward_placeholder_of_a_saved_zero_fill():
    seen = {}

    def fw(gm, inputs):
        record_forward(gm.graph)
        return make_boxed_func(gm.forward)

    def bw(gm, inputs):
        seen.update({n.name: saved_zeros(n) for n in gm.graph.nodes if n.op == "placeholder"})
        return make_boxed_func(gm.forward)

    def padded_bmm(x, w, idx):  # dropless bmm's padding: the partitioner saves the zero base for the backward
        xp = x.new_zeros(3, 5, 4).index_put((idx // 5, idx % 5), x)
        return torch.bmm(xp, w)[idx // 5, idx % 5]

    backend = aot_autograd(fw_compiler=fw, bw_compiler=bw, decompositions=select_decomp_table(),
                           partition_fn=min_cut_rematerialization_partition)
    torch._dynamo.reset()
    x, w = torch.randn(6, 4, requires_grad=True), torch.randn(3, 4, 4, requires_grad=True)
    torch.compile(padded_bmm, backend=backend)(x, w, torch.tensor([0, 3, 7, 8, 11, 14])).sum().backward()
    assert seen, "no backward graph compiled"
    zeros = [n for n, z in seen.items() if z]
    assert zeros == ["full"], seen  # the zero base; the indices, the weights and the tangent are not zeros
