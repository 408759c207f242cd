"""``cta_symm.cta_pipeline_mlp`` with one or both stages on their cuBLAS form (``runtime/cta_cublas.py``)
and the other on its Triton kernel, under ``TRITON_INTERPRET=1``: ``test_cta_kernels.py``'s fake group
(every rank in one process, stage 0 first; stream writes, waits and copy-engine copies done at once,
a stream wait asserting its flag is already up), so the cuBLAS forms must write the blocks, flags, Y
rows and tails that the kernels read, and read what they write. Row groups with the last one's
tails (rows shipped before the tails and after), shares, tp 1 and 2, GELU and SwiGLU, both transports."""

from __future__ import annotations

import ctypes
import os
from types import SimpleNamespace

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("interpreter tests: they run where CUDA is absent (CI)", allow_module_level=True)
pytest.importorskip("triton")

try:
    import test_cta_kernels as _kernels
except ImportError:  # imported as tests.kernels.test_cta_cublas_host_path
    from tests.kernels import test_cta_kernels as _kernels

from overlap_backend.runtime import cta_plan  # noqa: E402
from overlap_backend.runtime import cuda as _cuda  # noqa: E402
from overlap_backend.runtime.symm import lowering_helpers  # noqa: E402
from overlap_backend.spec import knobs  # noqa: E402

_cpu_allocator = _kernels._cpu_allocator  # (an autouse fixture there)
fake_host_path = _kernels.fake_host_path


class Stream:
    def wait_stream(self, other) -> None:
        pass


def _memcpy2d(dst, dst_pitch, src, src_pitch, width, height, stream):
    for i in range(height):
        ctypes.memmove(dst + i * dst_pitch, src + i * src_pitch, width)


@pytest.fixture
def cublas_world(monkeypatch, fake_host_path):
    """``fake_host_path`` plus what the cuBLAS stage 1 uses: a push stream, peer data addresses and the
    copy engine's copies (at once)."""
    monkeypatch.setattr(_kernels.FakeRank, "data_addr", lambda self, rank, off: self.g.data[rank].data_ptr() + off,
                        raising=False)
    monkeypatch.setattr(_cuda, "memcpy_async", lambda dst, src, n, stream: ctypes.memmove(dst, src, n))
    monkeypatch.setattr(_cuda, "memcpy2d_async", _memcpy2d)

    def make(*args, **kw):
        fake = fake_host_path(*args, **kw)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: Stream())  # (the fake's is None)
        for rank in fake.group.ranks:
            rank.push_stream = Stream()
        return fake

    return make


FORMS = [("cublas", "triton"), ("triton", "cublas"), ("cublas", "cublas")]
CASES = [  # (ws, act, F, M, num_sms, GELU share, transport, ship first); (M, num_sms) None: the fake's
    (2, "gelu", 1024, 40, 4, None, "ce", True),  # two row groups, the last one's tail
    (2, "gelu", 1024, 40, 4, None, "ce", False),
    (2, "gelu", 1024, 50, 4, 256, "peer", True),  # and a stage-1 share; stage 0's transport "peer"
    (4, "gelu", 1024, 40, 2, None, "ce", True),  # tp 2: two stage-0 ranks' tails, Y rows by 2-D copies
    (2, "swiglu", 1024, None, None, None, "ce", True),  # SwiGLU's share
    (4, "swiglu", 1536, None, None, None, "peer", True),
]


# every case with both stages on cuBLAS; each mixed pair (a cuBLAS stage beside a Triton one) on some cases, tp 2 both
MATCH = [(case, FORMS[2]) for case in CASES] + [(CASES[i], FORMS[f]) for i, f in ((0, 0), (2, 1), (3, 0), (3, 1),
                                                                                (4, 1), (5, 0))]


@pytest.mark.parametrize("case,forms", MATCH,
                         ids=[f"ws{c[0]}-{c[1]}-F{c[2]}-M{c[3]}-{c[6]}-ship{int(c[7])}-{f[0]}-{f[1]}" for c, f in MATCH])
def test_cublas_stages_match_mlp(cublas_world, forms, case):
    ws, act, F_, M, num_sms, share, transport, ship_first = case
    fake = cublas_world(ws, F_, transport, num_sms=num_sms, M=M)
    before = dict(lowering_helpers.PATHS)
    with knobs.cta.patch(STAGE0_GEMM=forms[0], STAGE1_GEMM=forms[1], GELU_SHARE_COLS=share,
                         SHIP_BEFORE_TAILS=ship_first):
        plan = cta_plan.chunk_plan(fake.M, F_, fake.N, ws // 2, act == "swiglu", torch.float32,
                                   num_sms or fake.group.ranks[0].num_sms, H=fake.H)
        assert (plan.tail > 0) == (act == "gelu") and (plan.f1 > 0) == (act == "swiglu" or bool(share)), plan
        fake.check_calls(act)
    tp = ws // 2
    for stage in (0, 1):  # 2 calls on each of the stage's tp ranks
        key = f"cta_pipeline_mlp:symm:stage{stage}_{forms[stage]}"
        assert lowering_helpers.PATHS[key] - before.get(key, 0) == 2 * tp, (key, dict(lowering_helpers.PATHS))


# each pair of forms once, on GELU with tails, tp 2 and SwiGLU's share
CAPTURED = [(CASES[0], FORMS[2]), (CASES[3], FORMS[0]), (CASES[4], FORMS[1]), (CASES[3], FORMS[2])]


@pytest.mark.parametrize("case,forms", CAPTURED,
                         ids=[f"ws{c[0]}-{c[1]}-F{c[2]}-M{c[3]}-{c[6]}-ship{int(c[7])}-{f[0]}-{f[1]}" for c, f in CAPTURED])
def test_cublas_stages_on_the_captured_protocol(cublas_world, monkeypatch, forms, case):
    """The captured protocol (what a CUDA graph replays): epochs counted on the device, the cuBLAS
    forms' waits by ``wait_kernel``, stage 0's done flags raised to 1 and reset by the pushes, the
    consumers' arrival flags raised by a copy of the device epoch; calls on it and eager calls mixed."""
    from overlap_backend.runtime import cta_symm
    from overlap_backend.spec import symm_layout as layout

    ws, act, F_, M, num_sms, share, transport, ship_first = case
    fake = cublas_world(ws, F_, transport, num_sms=num_sms, M=M)
    monkeypatch.setattr(_kernels.FakeRank, "captured_call", lambda self, compute, finished: None, raising=False)
    monkeypatch.setattr(_kernels.FakeRank, "stall_if_a_peer_gave_up", lambda self, compute: None, raising=False)
    monkeypatch.setattr(cta_symm, "_captured", False)  # (the module's flag, set by a capture)
    # a real capture, as the fake's CPU tensors cannot show one (lowering_helpers.capturing asks for CUDA tensors)
    monkeypatch.setattr(cta_symm, "capturing", lambda t: torch.cuda.is_current_stream_capturing())
    monkeypatch.setattr(cta_symm, "eager_protocol_run", lambda t: False)
    for rank in fake.group.ranks:  # (a capture checks that the eager calls grew the buffer)
        rank.data = SimpleNamespace(nbytes=1 << 40)
    graph = layout.cta_block(True)
    with knobs.cta.patch(STAGE0_GEMM=forms[0], STAGE1_GEMM=forms[1], GELU_SHARE_COLS=share,
                         SHIP_BEFORE_TAILS=ship_first):
        fake.check_calls(act, calls=1)  # eager first: placement, buffers
        for call in range(1, 4):
            # every rank's begin_kernel ran before any rank's stage (all ranks count the same epochs)
            for r in range(ws):
                for p in range(ws):
                    if p != r:
                        fake.group.flags[p][graph + layout.CTA_READY + r] = call
            monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
            x = fake.xs * (call + 2)
            outs = fake.call(x, act)
            monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
            ref = fake.reference(x, act)
            for r in range(ws):
                assert fake.group.ranks[r].status[1][0] == 0, f"rank {r} gave up a wait (call {call})"
                assert fake.group.flags[r][graph + layout.CTA_EPOCH] == call
                torch.testing.assert_close(outs[r], ref, atol=1e-4, rtol=1e-4)
                assert torch.equal(outs[r], outs[0]), f"rank {r}'s result differs from rank 0's"
                done = fake.group.flags[r][graph + layout.CTA_DONE:graph + layout.CTA_Y_DONE]
                # (a stage-1 rank's share kernel raises done flags of its own that nothing awaits)
                assert r >= ws // 2 or done.eq(0).all(), f"rank {r}: a done flag left up (the pushes reset them)"
            if call == 2:
                fake.check_calls(act, calls=1)  # an eager call between (separate epochs)
