"""GPU tests (marker ``gpu``) of CTA-pipelining: ``overlap::cta_pipeline_mlp`` under ``symm``.

2 GPUs: stage 0 on rank 0, stage 1 on rank 1; 4 GPUs: 2 stages x TP2; 8 GPUs: 2 stages x TP4 (the
symm kernels pipeline exactly 2 stages: 4 stages x TP2 is not supported, see docs/cta.md). Each rank holds the
tensor-parallel shards of a row-parallel MLP (``w1``/``w3`` columns, ``w2`` rows) and the same
input; the reference is the float32 MLP of each rank's shards, all-reduced. Checked:

- numerics on fresh random data for GELU (erf, tanh) and SwiGLU, with and without biases, bf16,
  fp16 and fp32, M not a multiple of the tile (1, 200, 129 rows), M over several row groups; the
  group's symmetric buffer is poisoned with NaN before the checked call (stale data would show);
  every rank's result the same bits (as an all-reduce); the cases again with each of
  ``knobs.cta.SWIGLU_SHARE_ROUNDS``, ``STAGE0_TMA_STORE``, ``STAGE0_SPLIT_LAST`` and
  ``SHIP_BEFORE_TAILS`` set to its other value, and split-K's sums in their other form (``SPLIT_SUM_PAIRS``,
  ``STAGE1_SPLIT_FIXUP``, ``STAGE0_SPLIT_FIXUP``, ``STAGE0_STREAM_K``, ``STAGE0_STREAM_K_TAIL``) on three cases
  each; stage 0 in each Gluon form
  (``STAGE0_FORM``) on every 16-bit GELU case it runs, twice, and the form a ratio file measured fastest
  (``"measured"``) run by the stage-0 ranks;
- 30 back-to-back calls on distinct inputs, each right; 50 on the same input, bit-identical; an
  in-place weight update (version counter) seen by the next call (the placement is redone); with and
  without TMA stores;
- what the kernels do not cover (``stages=3``) falls back to p2p and is still right;
- the compiled row-parallel MLP with the ``cta_pipeline`` pass and ``lowering="symm"`` vs eager;
- CUDA graphs: the op captured once and replayed on new inputs (each replay right), eager calls
  interleaved with replays, and ``torch.compile(mode="reduce-overhead")`` of the MLP.
"""

from __future__ import annotations

import json
import os
import tempfile

os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})

import pytest  # noqa: E402
import torch  # noqa: E402

try:
    from test_gpu import _need_gpus, _rel_err, _run, _setup_rank, _tol, shared_gpu
except ImportError:  # imported as tests.gpu.test_gpu_cta
    from tests.gpu.test_gpu import _need_gpus, _rel_err, _run, _setup_rank, _tol, shared_gpu

pytestmark = pytest.mark.gpu
WORLD_SIZES = pytest.mark.parametrize("ws", [2, 4, 8], ids=["ws2", "ws4", "ws8"])

# (M, H, F (all ranks), N, activation, approximate, bias, dtype)
CASES = [
    (256, 512, 2048, 512, "gelu", "none", True, torch.bfloat16),
    (200, 256, 1024, 384, "gelu", "tanh", False, torch.bfloat16),
    (129, 512, 2048, 256, "swiglu", "none", True, torch.float16),
    (1, 256, 1024, 256, "gelu", "none", True, torch.bfloat16),
    # few rows (knobs.cta.FEW_ROWS): both stages in 64-row blocks (FEW_ROWS_WARPS warps), SwiGLU's two accumulators too
    (40, 512, 2048, 512, "swiglu", "none", True, torch.bfloat16),
    (64, 256, 1024, 256, "swiglu", "none", False, torch.float32),
    # one 128-row block whose stage 1 splits: its runs' sums added by the kernel after them (STAGE1_FIXUP_CALL_ROWS)
    (96, 512, 2048, 512, "gelu", "tanh", True, torch.bfloat16),
    (1500, 1024, 4096, 1024, "swiglu", "none", False, torch.bfloat16),  # several row groups
    # F large enough that the stage-1 ranks' share of the first GEMM (cta_plan.stage1_share, whole
    # lcm(256, 128 tp) tiles) is not 0 at tp=4 too (8 GPUs: 512 columns; the cases above give 0 there)
    (320, 512, 5120, 512, "swiglu", "none", True, torch.bfloat16),
    # GELU in several row groups (wide N: a group holds one wave of stage-1 tiles), so only the last
    # group has a stage-0 tail (knobs.cta.MULTI_GROUP_TAIL); rows not a multiple of the block
    (1100, 1024, 4096, 8192, "gelu", "tanh", True, torch.bfloat16),
    # SwiGLU whose share in whole rounds (knobs.cta.SWIGLU_SHARE_ROUNDS) differs at 2 GPUs on 132 SMs
    (640, 1024, 16384, 1024, "swiglu", "none", True, torch.bfloat16),
    # GELU whose stage 0 ends in a short round of tail tiles at 2 GPUs on 132 SMs (180 tiles: 48 left
    # for the last round, all in the tail): knobs.cta.STAGE0_SPLIT_LAST splits them
    (512, 1024, 16384, 1024, "gelu", "tanh", True, torch.bfloat16),
    # a last round of stage-0 tail tiles split in halves at 2 GPUs whether the ranks hold a GPU each or share one
    # (symm.kernel_sms: 132, 128 or 64 SMs)
    (1024, 512, 6144, 512, "gelu", "tanh", True, torch.bfloat16),
]
# The knobs of split-K's sums: the GPU test runs three splitting cases in their other form (the test's time)
SPLIT_SUMS = ("SPLIT_SUM_PAIRS", "STAGE1_SPLIT_FIXUP", "STAGE0_SPLIT_FIXUP", "STAGE0_STREAM_K", "STAGE0_STREAM_K_TAIL")
# Every F is a multiple of 128 * tp (tp = ws/2 ranks per stage: 4 at 8 GPUs) and every N of tp, so the
# kernels take every case at 2, 4 and 8 GPUs; F / ws is each rank's shard.


def _splits_last_round(plan, M, F, tp, num_sms) -> bool:
    """Stage 0 of this plan makes its last round in half-width tiles (with STAGE0_SPLIT_LAST)."""
    from overlap_backend.codegen import cta

    fp = (F - plan.f1) // tp
    bm, bn, group_m = plan.cfg0[0], plan.cfg0[1], plan.cfg0[3]
    return cta.split_tail_tiles(M, fp, plan.fship, bm, bn, group_m, plan.tail_group, num_sms) > 0


def _shards(ws, M, H, F, N, act, bias, dtype, device):
    import torch.distributed as dist

    f = F // ws
    x = torch.randn(M, H, device=device).to(dtype)
    dist.broadcast(x, src=0)  # the row-parallel MLP's input is the same on every rank
    w1 = (torch.randn(H, f, device=device) * H**-0.5).to(dtype)
    w3 = (torch.randn(H, f, device=device) * H**-0.5).to(dtype) if act == "swiglu" else None
    w2 = (torch.randn(f, N, device=device) * F**-0.5).to(dtype)
    b1 = torch.randn(f, device=device).to(dtype) if bias else None
    b3 = torch.randn(f, device=device).to(dtype) if bias and w3 is not None else None
    b2 = torch.randn(N, device=device).to(dtype) if bias else None
    return x, w1, b1, w3, b3, w2, b2


def _reference(args, act, approximate, group):
    import torch.distributed as dist
    import torch.nn.functional as F

    x, w1, b1, w3, b3, w2, b2 = (t.float() if t is not None else None for t in args)
    h = x @ w1 + (b1 if b1 is not None else 0)
    a = F.silu(h) * (x @ w3 + (b3 if b3 is not None else 0)) if act == "swiglu" else F.gelu(h, approximate=approximate)
    y = a @ w2 + (b2 if b2 is not None else 0)
    dist.all_reduce(y, group=group)
    return y


def _same_on_every_rank(out, group) -> bool:
    """Every rank returned the same bits (as an all-reduce does)."""
    import torch.distributed as dist

    outs = [torch.empty_like(out) for _ in range(dist.get_world_size(group))]
    dist.all_gather(outs, out.contiguous(), group=group)
    return all(torch.equal(o, outs[0]) for o in outs)


def _poison(group_name, device):
    import torch.distributed as dist

    from overlap_backend.runtime import symm

    st = symm.state(group_name, device)
    if st is not None and st.data is not None:
        st.data_view(torch.float32, (st.data.nbytes // 4,)).fill_(float("nan"))
    torch.cuda.synchronize()
    dist.barrier()


def cta_worker(rank: int, ws: int, device: str):
    import torch.distributed as dist

    _setup_rank(rank, device)
    from overlap_backend.runtime.symm import lowering_helpers

    group = dist.group.WORLD
    op = torch.ops.overlap.cta_pipeline_mlp
    bad, report = [], []

    def call(args, act, approximate, stages=2):
        x, w1, b1, w3, b3, w2, b2 = args
        return op(x, w1, b1, w3, b3, w2, b2, act, approximate, stages, group.group_name, "symm")

    def checked_call(args, act, approximate, dtype, label):
        """A call against the float32 reference: its error reported, a wrong or rank-dependent result noted."""
        out = call(args, act, approximate)
        err = _rel_err(out, _reference(args, act, approximate, group))
        report.append(f"{label}: rel err {err:.2e}")
        if not err <= _tol(dtype):
            bad.append(f"rank {rank}: {label}: rel err {err:.3e}")
        if not _same_on_every_rank(out, group):
            bad.append(f"rank {rank}: {label}: the ranks' results differ")

    from overlap_backend.codegen import cta
    from overlap_backend.runtime import cta_plan
    from overlap_backend.spec import knobs

    from overlap_backend.runtime import symm

    symm.group_support(group.group_name)  # (whether ranks share this GPU: the op's plans take fewer SMs there)
    num_sms = symm.kernel_sms(group.group_name, torch.cuda.get_device_properties(device).multi_processor_count)
    last_group_tails = 0
    for M, H, F, N, act, approximate, bias, dtype in CASES:
        plan = cta_plan.chunk_plan(M, F, N, ws // 2, act == "swiglu", dtype, num_sms, H=H)
        last_group_tails += plan.groups > 1 and plan.tail > 0
        args = _shards(ws, M, H, F, N, act, bias, dtype, device)
        call(args, act, approximate)  # set up buffers, compile
        _poison(group.group_name, torch.device(device, torch.cuda.current_device()))
        args = _shards(ws, M, H, F, N, act, bias, dtype, device)
        before = lowering_helpers.PATHS["cta_pipeline_mlp:symm"]
        label = f"M={M} H={H} F={F} N={N} {act}/{approximate} bias={bias} {dtype}"
        checked_call(args, act, approximate, dtype, label)
        if lowering_helpers.PATHS["cta_pipeline_mlp:symm"] != before + 1:
            bad.append(f"rank {rank}: {label} did not run on the symm kernels ({dict(lowering_helpers.PATHS)})")

    if not last_group_tails and ws <= 4:
        bad.append(f"rank {rank}: no case had several row groups and a tail (the last group's)")

    # Knobs whose other value must stay correct (the cases again, poisoned buffers): SwiGLU's share in
    # whole rounds (SWIGLU_SHARE_ROUNDS, on; off: at least one case with another share), stage 0's
    # staged tiles by TMA (STAGE0_TMA_STORE, on; off: every case), stage 0's last round of tail tiles
    # in half-width tiles (STAGE0_SPLIT_LAST, on; off: at least one case that splits), the last
    # group's rows shipped before the tails are added (SHIP_BEFORE_TAILS, on; off: a GELU case with a
    # tail, at 2 GPUs); split-K's sums read two slots at a time (SPLIT_SUM_PAIRS, off) or stage 1's added by a kernel
    # after it (STAGE1_SPLIT_FIXUP, at STAGE1_FIXUP_CALL_ROWS rows), stage 0's likewise (STAGE0_SPLIT_FIXUP, at
    # STAGE0_FIXUP_CALL_ROWS rows), its runs stream-K or not (STAGE0_STREAM_K, under the fix-up), an unsplit stage 0's
    # last round stream-K (STAGE0_STREAM_K_TAIL, the Triton kernel): the cases whose plan splits (or not), in the form
    # their rows do not take by default.
    for setting, what in (("SWIGLU_SHARE_ROUNDS", "another share"), ("STAGE0_TMA_STORE", "a case"),
                          ("STAGE0_SPLIT_LAST", "a split last round"),
                          ("SHIP_BEFORE_TAILS", "a tail at one stage-0 rank"),
                          ("SPLIT_SUM_PAIRS", "a split stage"), ("STAGE1_SPLIT_FIXUP", "a split stage 1"),
                          ("STAGE0_SPLIT_FIXUP", "a split stage 0"), ("STAGE0_STREAM_K", "a split stage 0"),
                          ("STAGE0_STREAM_K_TAIL", "a partial last round of stage-0 tiles")):
        changed = 0
        default = getattr(knobs.cta, setting)
        for M, H, F, N, act, approximate, bias, dtype in CASES:
            tp = ws // 2
            usual = cta_plan.chunk_plan(M, F, N, tp, act == "swiglu", dtype, num_sms, H=H)
            applies = {"SWIGLU_SHARE_ROUNDS": act == "swiglu", "STAGE0_TMA_STORE": True,
                       "STAGE0_SPLIT_LAST": act != "swiglu", "SHIP_BEFORE_TAILS": act != "swiglu" and tp == 1,
                       "SPLIT_SUM_PAIRS": max(usual.split0, usual.split1) > 1,
                       "STAGE1_SPLIT_FIXUP": usual.split1 > 1, "STAGE0_SPLIT_FIXUP": usual.split0 > 1,
                       "STAGE0_STREAM_K": usual.split0 > 1, "STAGE0_STREAM_K_TAIL": usual.split0 == 1}[setting]
            if not applies or (setting in SPLIT_SUMS and changed >= 3):
                continue  # (the split-K sums: three cases each, for the test's time)
            other = {setting: not default}
            if setting == "STAGE1_SPLIT_FIXUP":  # the form this call's rows do not take by default
                other = ({setting: False} if cta.stage1_sums_after_runs(M, usual.split1)
                         else {setting: True, "STAGE1_FIXUP_CALL_ROWS": (1, 1 << 30)})
            if setting == "STAGE0_SPLIT_FIXUP":
                other = ({setting: False} if cta.stage0_sums_after_runs(M, usual.split0)
                         else {setting: True, "STAGE0_FIXUP_CALL_ROWS": (1, 1 << 30)})
            if setting == "STAGE0_STREAM_K":  # (only where the fix-up kernel sums the runs)
                other = {setting: not default, "STAGE0_SPLIT_FIXUP": True, "STAGE0_FIXUP_CALL_ROWS": (1, 1 << 30)}
            if setting == "STAGE0_STREAM_K_TAIL":  # (the Triton kernel's: not a Gluon form)
                other = {setting: not default, "STAGE0_FORM": None}
            with knobs.cta.patch(**other):
                plan = cta_plan.chunk_plan(M, F, N, tp, act == "swiglu", dtype, num_sms, H=H)
                changed += {"STAGE0_TMA_STORE": True, "SWIGLU_SHARE_ROUNDS": plan.f1 != usual.f1,
                            "STAGE0_SPLIT_LAST": _splits_last_round(plan, M, F, tp, num_sms),
                            "SHIP_BEFORE_TAILS": plan.tail > 0, "SPLIT_SUM_PAIRS": True,
                            "STAGE1_SPLIT_FIXUP": True, "STAGE0_SPLIT_FIXUP": True, "STAGE0_STREAM_K": True,
                            "STAGE0_STREAM_K_TAIL": cta.stage0_partial_slots(M, H, (F - plan.f1) // tp, plan.cfg0, 1,
                                                                              num_sms, tail=True)[0] > 0}[setting]
                args = _shards(ws, M, H, F, N, act, bias, dtype, device)
                call(args, act, approximate)  # the placement with the setting's window
                _poison(group.group_name, torch.device(device, torch.cuda.current_device()))
                checked_call(_shards(ws, M, H, F, N, act, bias, dtype, device), act, approximate, dtype,
                             f"{other}: M={M} H={H} F={F} N={N} {act} bias={bias} {dtype}")
        if not changed and ws <= 2:
            bad.append(f"rank {rank}: {setting}={not default}: no case had {what}")

    # Stage 0's Gluon forms (knobs.cta.STAGE0_FORM set to each): every 16-bit GELU case whose stage 0 they run (no
    # split-K) in each form, twice on new inputs after poisoned buffers (a stale TMA descriptor would read the last call's).
    for form in ("ws_pingpong", "ws_coop"):
        ran = 0
        for M, H, F, N, act, approximate, bias, dtype in CASES:
            plan = cta_plan.chunk_plan(M, F, N, ws // 2, act == "swiglu", dtype, num_sms, H=H)
            if act == "swiglu" or dtype == torch.float32 or plan.split0 > 1:
                continue
            with knobs.cta.patch(STAGE0_FORM=form):
                call(_shards(ws, M, H, F, N, act, bias, dtype, device), act, approximate)
                _poison(group.group_name, torch.device(device, torch.cuda.current_device()))
                for i in range(2):
                    before = lowering_helpers.PATHS[f"cta_pipeline_mlp:symm:stage0_{form}"]
                    label = f"STAGE0_FORM={form} call {i}: M={M} H={H} F={F} N={N} {act}/{approximate} bias={bias}"
                    checked_call(_shards(ws, M, H, F, N, act, bias, dtype, device), act, approximate, dtype, label)
                    ran += lowering_helpers.PATHS[f"cta_pipeline_mlp:symm:stage0_{form}"] - before
        if not ran and ws <= 2 and rank < ws // 2:  # (only the stage-0 ranks run stage 0)
            bad.append(f"rank {rank}: STAGE0_FORM={form}: no stage 0 ran in it")

    # STAGE0_FORM "measured" (the default): a ratio file in which ws_coop beat the Triton kernel at a GELU case's
    # stage-0 GEMM makes the stage-0 ranks run that form there (the op's own lookup, no knob naming the form).
    from overlap_backend.codegen import cta_ws
    from overlap_backend.spec import kernel_ratios

    M, H, F, N, act, approximate, bias, dtype = (1024, 512, 6144, 512, "gelu", "tanh", True, torch.bfloat16)
    plan = cta_plan.chunk_plan(M, F, N, ws // 2, False, dtype, num_sms, H=H)
    coop_applies = plan.split0 == 1 and plan.cfg0[0] == 128  # (no split-K, 128-row blocks: ws_coop runs)
    if not coop_applies and ws <= 2:
        bad.append(f"rank {rank}: STAGE0_FORM=measured: the case's stage 0 splits K or takes 64-row blocks ({plan})")
    if coop_applies:
        coop = [*cta_ws.config("ws_coop", plan.cfg0), "ws_coop", 1]
        entry = {"gpu": kernel_ratios.gpu_name(), "kernel": "cta_stage0", "dtype": "bfloat16", "ws": ws, "M": M, "K": H,
                 "N": F // (ws // 2), "fused": True, "epilogue": "gelu_tanh", "ratio": 1.10, "best_variant_ratio": 1.0,
                 "best_config": coop, "variants": [[coop, 1.0]]}
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "ratios.json")
            with open(path, "w") as fh:
                json.dump(kernel_ratios.document([entry]), fh)
            with knobs.symm.patch(KERNEL_RATIOS_FILE=path), knobs.cta.patch(STAGE0_FORM="measured"):
                kernel_ratios.forget()
                before = lowering_helpers.PATHS["cta_pipeline_mlp:symm:stage0_ws_coop"]
                call(_shards(ws, M, H, F, N, act, bias, dtype, device), act, approximate)
                checked_call(_shards(ws, M, H, F, N, act, bias, dtype, device), act, approximate, dtype,
                             f"STAGE0_FORM=measured: M={M} H={H} F={F} N={N}")
                if rank < ws // 2 and lowering_helpers.PATHS["cta_pipeline_mlp:symm:stage0_ws_coop"] != before + 2:
                    bad.append(f"rank {rank}: STAGE0_FORM=measured did not run the measured ws_coop")
            kernel_ratios.forget()

    # Back-to-back calls: distinct inputs each right, then identical inputs bit-identical; with stage
    # 0's tiles stored by TMA (a tile counted before its bulk store landed would ship stale data) and
    # without. Then an in-place weight update: the placement must be redone (version counter).
    M, H, F, N = 300, 512, 2048, 512
    for settings in ({"STAGE0_TMA_STORE": False}, {"STAGE0_TMA_STORE": True}):
        args = _shards(ws, M, H, F, N, "swiglu", True, torch.bfloat16, device)
        with knobs.cta.patch(**settings):
            for i in range(30):
                x = torch.randn(M, H, device=device).to(torch.bfloat16)
                dist.broadcast(x, src=0)
                args = (x,) + args[1:]
                err = _rel_err(call(args, "swiglu", "none"), _reference(args, "swiglu", "none", group))
                if not err <= 1e-2:
                    bad.append(f"rank {rank}: distinct call {i} ({settings}): rel err {err:.3e}")
            first = call(args, "swiglu", "none")
            for i in range(50):
                if not torch.equal(call(args, "swiglu", "none"), first):
                    bad.append(f"rank {rank}: repeated call {i} ({settings}) differs from the first")
                    break
            args[1].mul_(0.5)
            err = _rel_err(call(args, "swiglu", "none"), _reference(args, "swiglu", "none", group))
            report.append(f"{settings}: after w1 *= 0.5: rel err {err:.2e}")
            if not err <= 1e-2:
                bad.append(f"rank {rank}: stale weights after an in-place update ({settings}): rel err {err:.3e}")

    # Not covered by the kernels: falls back to p2p (which gloo, under OVERLAP_TEST_SHARED_GPU, cannot run on CUDA tensors).
    if not shared_gpu():
        before = lowering_helpers.PATHS["cta_pipeline_mlp:p2p"]
        err = _rel_err(call(args, "swiglu", "none", stages=3), _reference(args, "swiglu", "none", group))
        if lowering_helpers.PATHS["cta_pipeline_mlp:p2p"] != before + 1 or not err <= 1e-2:
            bad.append(f"rank {rank}: stages=3 fallback: err {err:.3e}, paths {dict(lowering_helpers.PATHS)}")
    torch.cuda.synchronize()
    from overlap_backend.runtime import symm

    symm.check_status()
    assert not bad, "\n".join(bad)
    return report


def cta_compiled_worker(rank: int, ws: int, device: str):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    import torch.nn.functional as F

    _setup_rank(rank, device)
    from overlap_backend import make_backend
    from overlap_backend.runtime.symm import lowering_helpers

    group = dist.group.WORLD
    H, Fd, dtype = 1024, 4096, torch.bfloat16

    def mlp(x, wg, wu, w2):
        return funcol.all_reduce(F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), w2), "sum", group)

    f = Fd // ws
    wg = (torch.randn(f, H, device=device) * H**-0.5).to(dtype)
    wu = (torch.randn(f, H, device=device) * H**-0.5).to(dtype)
    w2 = (torch.randn(H, f, device=device) * Fd**-0.5).to(dtype)
    backend = make_backend(passes=["ag_mm", "mm_rs", "cta_pipeline", "mm_ar"], lowering="symm")
    compiled = torch.compile(mlp, backend=backend, fullgraph=True, dynamic=False)  # symbolic sizes: test_dynamic.py
    errs = []
    # 2100 rows (700 x 3) are not a multiple of 8: Inductor's shape padding used to time the padded
    # matmul against the plain one on each rank's (shared) GPU and, when padding won, hid the MLP from
    # the pass in that graph (a run in a few failed: one of the two calls did not reach the op). The
    # backend turns shape padding off for graphs with collectives; force_shape_pad makes the padding
    # certain wherever it is not off, so this fails every time without that.
    with torch.no_grad(), torch._inductor.config.patch(force_shape_pad=True):
        for tokens in (2, 700):
            x = torch.randn(tokens, 3, H, device=device).to(dtype)
            dist.broadcast(x, src=0)
            ref = mlp(x.float(), wg.float(), wu.float(), w2.float())
            errs.append(_rel_err(compiled(x, wg, wu, w2), ref))
    applied = [[m.pass_name for m in r.matches if m.applied] for r in backend.reports if r.matches]
    assert len(applied) == 2 and all("cta_pipeline" in a for a in applied), (applied,
                                                                           [r.to_json() for r in backend.reports])
    assert lowering_helpers.PATHS["cta_pipeline_mlp:symm"] == 2, dict(lowering_helpers.PATHS)
    assert all(e <= 1e-2 for e in errs), errs
    return {"errs": errs, "applied": applied}


def cta_graph_worker(rank: int, ws: int, device: str):
    import torch.distributed as dist

    _setup_rank(rank, device)
    from overlap_backend.runtime import symm
    from overlap_backend.spec import knobs

    group = dist.group.WORLD
    op = torch.ops.overlap.cta_pipeline_mlp
    report, bad = [], []
    # (M=1100, N=8192: several row groups, the last one's stage-0 tail, replayed); stage 0's tiles by
    # the copy engine (done flags awaited and reset by the captured stream operations, the consumer's
    # flag raised by a copy of the device epoch) and by peer stores
    cases = [(transport, *case) for transport in ("ce", "peer")
             for case in ((64, 512, "swiglu", "none"), (300, 512, "gelu", "tanh"), (1100, 8192, "gelu", "tanh"))]
    for transport, M, N, act, approximate in cases:
        with knobs.cta.patch(TRANSPORT=transport):
            args = _shards(ws, M, 512, 2048, N, act, True, torch.bfloat16, device)
            x = args[0]

            def call():
                return op(*args[:1], *args[1:], act, approximate, 2, group.group_name, "symm")

            call()  # eager first: buffers, weight placement, kernels
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                call()
            torch.cuda.current_stream().wait_stream(stream)
            with torch.cuda.graph(graph):
                out = call()
            errs = []
            for i in range(12):
                fresh = torch.randn(M, 512, device=device).to(torch.bfloat16)
                dist.broadcast(fresh, src=0)
                x.copy_(fresh)
                if i % 4 == 3:  # an eager call between replays (the eager and graph epochs are separate)
                    errs.append(_rel_err(call(), _reference(args, act, approximate, group)))
                out.fill_(float("nan"))
                graph.replay()
                errs.append(_rel_err(out, _reference(args, act, approximate, group)))
            torch.cuda.synchronize()
            symm.check_status()
            report.append(f"{transport} M={M} {act}: graph replays + eager calls, max rel err {max(errs):.2e}")
            if not max(errs) <= 1e-2:
                bad.append(f"rank {rank}: {transport} M={M} {act}: errs {errs}")
    assert not bad, "\n".join(bad)
    return report


def cta_reduce_overhead_worker(rank: int, ws: int, device: str):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    import torch.nn.functional as F

    _setup_rank(rank, device)
    from overlap_backend import make_backend
    from overlap_backend.runtime.symm import lowering_helpers

    group = dist.group.WORLD
    H, Fd, dtype = 512, 2048, torch.bfloat16

    def mlp(x, w1, w2):
        return funcol.all_reduce(F.linear(F.gelu(F.linear(x, w1), approximate="tanh"), w2), "sum", group)

    class Mlp(torch.nn.Module):
        """Weights as parameters, as users write it: cudagraph trees keep parameters in place (static
        addresses), while plain tensor inputs are copied into the graph's pool on every replay, which
        the op's weight placement cannot follow (it raises, naming the cause)."""

        def __init__(self, w1, w2):
            super().__init__()
            self.w1, self.w2 = torch.nn.Parameter(w1, requires_grad=False), torch.nn.Parameter(w2, requires_grad=False)

        def forward(self, x):
            return mlp(x, self.w1, self.w2)

    f = Fd // ws
    w1 = (torch.randn(f, H, device=device) * H**-0.5).to(dtype)
    w2 = (torch.randn(H, f, device=device) * Fd**-0.5).to(dtype)
    backend = make_backend(passes=["cta_pipeline"], lowering="symm")
    compiled = torch.compile(Mlp(w1, w2), backend=backend, mode="reduce-overhead", fullgraph=True)
    errs = []
    with torch.no_grad():
        for _ in range(6):
            x = torch.randn(96, H, device=device).to(dtype)
            dist.broadcast(x, src=0)
            errs.append(_rel_err(compiled(x).clone(), mlp(x.float(), w1.float(), w2.float())))
    assert lowering_helpers.PATHS["cta_pipeline_mlp:symm"] >= 1, dict(lowering_helpers.PATHS)
    assert all(e <= 1e-2 for e in errs), errs
    return {"errs": errs, "symm calls (host-visible, not replays)": lowering_helpers.PATHS["cta_pipeline_mlp:symm"]}


@WORLD_SIZES  # 2 stages x TP1, TP2, TP4: the layouts bench_cta --graphs replays
@pytest.mark.timeout(300)
def test_cta_pipeline_symm_cuda_graphs(ws):
    _need_gpus(ws)
    for rank, report in enumerate(_run(cta_graph_worker, ws, timeout=280)):
        if rank == 0:
            print(f"ws={ws}:\n  " + "\n  ".join(report))
    env = {"OVERLAP_INDUCTOR": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    print(_run(cta_reduce_overhead_worker, ws, timeout=280, env=env)[0])


@WORLD_SIZES
@pytest.mark.timeout(300)
def test_cta_pipeline_symm_numerics(ws):
    _need_gpus(ws)
    for rank, report in enumerate(_run(cta_worker, ws, timeout=280)):
        if rank == 0:
            print(f"ws={ws}:\n  " + "\n  ".join(report))


@pytest.mark.gpu_smoke
@pytest.mark.parametrize("ws", [2], ids=["ws2"])
@pytest.mark.timeout(300)
def test_cta_pipeline_symm_compiled(ws):
    _need_gpus(ws)
    env = {"OVERLAP_INDUCTOR": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    print(_run(cta_compiled_worker, ws, timeout=280, env=env)[0])
