"""overlap::grouped_mm_weight_grad: the weight gradient transformers' grouped_mm_fallback_backward computes."""

import pytest
import torch

import overlap_backend  # noqa: F401 - registers torch.ops.overlap


@pytest.mark.parametrize("counts", [[3, 0, 5, 2], [0, 0, 4], [6]])
def test_matches_transformers_fallback_backward(counts):
    pytest.importorskip("transformers")
    import transformers.integrations.moe  # noqa: F401 - registers transformers::grouped_mm_fallback*

    gen = torch.Generator().manual_seed(0)
    m, k, n = sum(counts), 8, 5
    x, g = torch.randn(m, k, generator=gen), torch.randn(m, n, generator=gen)
    w = torch.randn(len(counts), k, n, generator=gen)
    offs = torch.tensor(counts).cumsum(0).to(torch.int32)
    dx_ref, dw_ref = torch.ops.transformers.grouped_mm_fallback_backward(x, w, offs, g)
    dw = torch.ops.overlap.grouped_mm_weight_grad(x, g, offs)
    torch.testing.assert_close(dw, dw_ref)
    assert dw.shape == (len(counts), k, n) and not dw[[i for i, c in enumerate(counts) if c == 0]].any()
    # the input gradient as the split graph computes it: the forward's grouped GEMM on W^T
    dx = torch.ops.transformers.grouped_mm_fallback(g, w.permute(0, 2, 1), offs)
    torch.testing.assert_close(dx, dx_ref)


def test_fake_shape_and_bad_inputs():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        out = torch.ops.overlap.grouped_mm_weight_grad(torch.empty(7, 4), torch.empty(7, 3),
                                                       torch.empty(2, dtype=torch.int32))
    assert out.shape == (2, 4, 3)
    with pytest.raises(ValueError, match="grouped_mm_weight_grad"):
        torch.ops.overlap.grouped_mm_weight_grad(torch.randn(7, 4), torch.randn(6, 3), torch.tensor([7]))
