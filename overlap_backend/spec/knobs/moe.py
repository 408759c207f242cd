"""Tunables of the ``moe_experts`` symm lowering (``runtime/moe_symm.py``; what each measured: docs/moe.md)."""

from .base import Knobs

moe = Knobs(
    "moe",
    # The symm moe_experts kernels run at all (False: the op runs on p2p under symm, the same on every
    # rank); on since they pass the GPU tests on 2xH200 (tests/gpu/test_gpu_moe.py).
    ENABLED=True,
    # With comm SMs, who ships the results back: "ce" (the copy engine; the comm kernel only copies them
    # out), "sm" (the comm kernel stores into the peers too; measured slower, docs/moe.md#measured) or
    # "ce-only" (no comm kernel at all).
    TRANSPORT="ce",
    # SMs of the communication kernel for an op called without comm_sms; None reads OVERLAP_MOE_COMM_SMS
    # per call (0 by default: no comm kernel, bench/results/moe_h200x2_2026-12-01/no_comm_kernel/README.md).
    COMM_SMS=None,
    # "phased": gate/up + down once per source position, so the first source's results travel while the
    # rest computes; "rotated" (one launch each) measured slower end to end (DeepSeek-like 7.60 vs 6.30 ms,
    # bench/results/moe_h200x2_2026-11-30/grouped_raster/README.md).
    SCHEDULE="phased",
    # "phased" only: the fraction of the own experts computed before the remote rows, while the dispatch
    # is in flight (not measured with these kernels yet).
    OWN_FIRST=0.0,
    # Tile order: "auto" (expert-major below EXPERT_MAJOR_ROWS, else remote-first), or forced "source" or
    # "expert" (a local choice: nothing communicated depends on it).
    ORDER="auto",
    # "auto" order: expert-major below this many rows per (source, expert) group on average, where the
    # experts are weight-bandwidth bound and reading each expert's weights once per source costs more.
    EXPERT_MAJOR_ROWS=128,
    # Expert-major order only: a row tile of the expert GEMM kernels spans the sources of one expert (rows of several
    # (source, expert) groups) instead of one group's, so that groups shorter than a tile (decode sizes: 16-32 rows a
    # group against 64-row tiles) do not compute rows they throw away; its rows are gathered from their sources'
    # dispatch slots and each row's result goes to its source. Off until it is run and timed on a GPU.
    SPAN_SOURCES=False,
    # The device-side work list by codegen/moe_plan.py's one kernel where it applies (host time is most of
    # a decode-size layer); False: always the torch ops (plan_reference).
    PLAN_KERNEL=True,
    # Distinct offset lists kept on the device (capacity routing repeats its splits; dropless routing
    # makes new ones every call, which are copied without being kept past this many).
    META_MAX=64,
    # Who computes the expert GEMMs: "triton" (the persistent grouped kernels, codegen/moe_gemm.py),
    # "grouped_mm" (torch._grouped_mm per source segment, runtime/moe_grouped.py, where its constraints
    # hold) or "auto": the faster of the two where the form and both Triton GEMMs were measured near the shape
    # on this GPU, else Triton (spec/kernel_ratios.json; on an H100 the form wins at decode sizes and loses at
    # prefill, where its gather and scatter passes cost more than the kernels lose:
    # bench/results/kernels_h100x1_2026-12-05/forms.md).
    EXPERT_GEMM="auto",
)
