"""Tunables of CTA-pipelining (its symm schedule, read by the runtime and by the cost model).

The plan they shape is ``runtime/cta_plan.py``; docs/cta.md tells what each one does and what it
measured. Block configs are ``(BM, BN, BK, GROUP_M placeholder, num_stages, num_warps)``.
"""

from .base import Knobs

cta = Knobs(
    "cta",
    # K-chunks per stage-0 rank: a stage-1 CTA waits this often.
    K_CHUNKS=4,
    # Stage 1 reads the chunks that are already here after each wait in one software-pipelined K-loop (a
    # run), so that its pipeline refills once per run rather than once per chunk (codegen/cta.py). One H100:
    # faster at 12 and 15 of 15 stage-1 shapes in two runs, 3-6 % at 8 GPUs' 512-4096 rows
    # (bench/results/kernels_h100x1_2026-12-06/ready_runs/).
    STAGE1_READY_RUNS=True,
    # How stage-0 tiles reach the stage-1 ranks: "ce" (stored locally, shipped by the copy engine block
    # by block) or "peer" (stored straight into the consumers' memory), which measured slower at every M
    # (bench/results/cta_h200x2_2026-11-30/last_group_tails/README.md).
    TRANSPORT="ce",
    # SwiGLU: stage-1 ranks compute a share of the first GEMM, which balances the stages' work.
    STAGE1_SHARE=True,
    # GELU: stage-1 ranks compute about one round of the first GEMM's last columns first, so that they
    # work through the pipeline's fill (M=512: 0.635 -> 0.505 ms, bench/results/cta_h200x2_2026-11-30/small_m/).
    GELU_FILL_SHARE=True,
    # GELU: the largest share of the first GEMM's columns stage-1 ranks compute themselves (the placement
    # keeps that window of W1 on the stage-1 ranks for every M).
    GELU_SHARE_MAX=0.3,
    # GELU share in columns for every call (within the window), instead of one round of tiles: for probes.
    GELU_SHARE_COLS=None,
    # GELU: each stage-0 rank multiplies the last columns it makes (its tail) by their W2 rows itself, so
    # that stage 1 does not wait for the columns stage 0 makes last (the pipeline's drain; docs/cta.md).
    STAGE0_TAIL=True,
    # The most tail columns per stage-0 rank, as a fraction of F / tp (the placement keeps their W2 rows).
    TAIL_MAX=0.3,
    # Tail columns per stage-0 rank for every call, instead of the whole-rounds balance: for probes.
    TAIL_COLS=None,
    # GELU with several row groups: the last group's tail too, which took 0.08 ms off M=1024
    # (bench/results/cta_h200x2_2026-11-30/last_group_tails/README.md).
    MULTI_GROUP_TAIL=True,
    # SwiGLU: the stage-1 share that balances the stages in whole rounds of SMs, not in work (M=512 on
    # 2xH200: 0.624 vs 0.696 ms, bench/results/cta_h200x2_2026-11-30/tma_store/README.md).
    SWIGLU_SHARE_ROUNDS=True,
    # SwiGLU whole-rounds share: searched within this many share units of the balanced-work share.
    SWIGLU_SHARE_SLACK=4,
    # Stage 0 counts the first row group's tiles right after their stores, since they are the pipeline's
    # fill (GELU, M=4096 on 2xH200: 3.17 vs 3.25 ms, bench/probe_cta.py).
    COUNT_FIRST_GROUP_AT_ONCE=True,
    # Stage 0 (and the stage-1 share) stores its staged tiles by TMA, which measured faster at every M
    # (bench/results/cta_h200x2_2026-11-30/tma_store/README.md).
    STAGE0_TMA_STORE=True,
    # Stage 0's last partial round of tail tiles in half-width tiles, which shortens the critical path at
    # M=512 (0.421 vs 0.434 ms, bench/results/cta_h200x2_2026-11-30/tma_store/README.md).
    STAGE0_SPLIT_LAST=True,
    # One stage-0 rank: the last group's rows are shipped before the tails' partial products are added, so
    # the two transfers overlap (0.435 vs 0.450 ms at M=512, bench/results/cta_h200x2_2026-11-30/tma_store/).
    SHIP_BEFORE_TAILS=True,
    # A stage with few tiles (decode sizes): each tile's K in several runs on as many SMs, the last run adding
    # the partial sums (None: as runtime/cta_plan.split_runs decides; a number: the runs of every call, 1 for
    # none). Stage 0 splits its K-steps, stage 1 its K-chunks.
    STAGE0_SPLIT_K=None,
    STAGE1_SPLIT_K=None,
    # The run that finishes a split tile reads the other runs' float32 sums two slots at a time, both loads in flight
    # before either is added (the same additions in the same order: the same bits). Off: one H200, stage 1 at 2, 4
    # and 8 GPUs' 16-row decode shapes 0-3 % slower than one slot at a time; at 128 rows faster (0.93-1.27x cuBLAS
    # against 0.98-1.63x), where STAGE1_SPLIT_FIXUP sums them (bench/results/kernels_h200x1_2026-12-07/cta1_split_sums/).
    SPLIT_SUM_PAIRS=False,
    # Stage 1's split tiles of a call of STAGE1_FIXUP_CALL_ROWS rows (both ends in) are summed by a kernel launched
    # after it, one program per STAGE1_FIXUP_ROWS rows of a tile (every SM sums and stores; in the kernel the last run
    # of each tile does it alone), in run order (the same bits). One H200, stage 1 at 2, 4 and 8 GPUs' decode shapes:
    # at 128 rows 0.93-1.19x cuBLAS against 0.98-1.63x summed in the kernel; at 16 rows (64-row blocks) 1.08-1.21x
    # against 1.05-1.18x, the extra launch not paid back (same results). 4 rows a program: several programs on each
    # SM, their slot loads in flight together (ptxas keeps about two of a thread's loads in flight whatever the unroll).
    STAGE1_SPLIT_FIXUP=True,
    STAGE1_FIXUP_ROWS=4,
    # (65, 128): the calls of one 128-row block (FEW_ROWS' calls run 64-row blocks); 17-127 rows not measured.
    STAGE1_FIXUP_CALL_ROWS=(65, 128),
    # Stage 0's split tiles of a call of STAGE0_FIXUP_CALL_ROWS rows (both ends in) summed by a kernel after it as
    # stage 1's are (stage0_split_sum_kernel, STAGE0_FIXUP_ROWS rows of a tile a program: activation, stores, chunk
    # counts). One H100, stage 0 + tanh GELU at 2, 4 and 8 GPUs' decode shapes, each form in the same call: at 128
    # rows 0.99-1.14x cuBLAS with 8 rows a program against 0.99-1.21x summed in the kernel (8 GPUs: 1.21 -> 1.14,
    # its SMs active 58 % of the in-kernel form on an H200); at 16 rows 0.96-1.08x against 0.96-1.06x, no gain
    # (bench/results/kernels_h100x1_2026-12-08/cta_fixup).
    STAGE0_SPLIT_FIXUP=True,
    STAGE0_FIXUP_ROWS=8,
    STAGE0_FIXUP_CALL_ROWS=(65, 128),
    # Where the fix-up kernel sums stage 0's split tiles, the runs are stream-K: every SM one equal share of all tiles'
    # K-steps, a piece of each tile it meets in its own slot (cta._stream_k_runs), instead of whole runs a tile, which
    # at 8 GPUs' 128-row shape (28 tiles x 4 runs on 132 SMs) leave 20 SMs idle. Off until timed.
    STAGE0_STREAM_K=False,
    # An unsplit stage 0's last, partial round of tiles stream-K: every SM an equal share of those tiles' K-steps,
    # the fix-up kernel adding the pieces, the whole tiles before them counted as its pieces (cta.stage0_partial_slots).
    # The 85 % or 39 % full last rounds of 224 and 448 tiles on 132 SMs are where stage 0 stays over 1.03x at 512
    # and 1024 rows. Off until timed.
    STAGE0_STREAM_K_TAIL=False,
    # Stage 0 in a warp-specialized Gluon form where it applies (codegen/cta_ws.py: GELU, the copy-engine transport
    # with TMA stores, no split-K, 128-row blocks for "ws_coop"): "ws_pingpong" (128-column tiles in turns) or
    # "ws_coop" (128 x 256 tiles shared); "measured": the form the kernel benchmark measured fastest at the nearest
    # shape where it beat the Triton kernel by knobs.codegen.MEASURED_VARIANT_GAIN (spec/kernel_ratios.json), else
    # the Triton kernel; None: the Triton kernel. One H100, every non-split prefill shape of the kernel benchmark,
    # two runs: the faster form 0.97x the Triton kernel's time at each (bench/results/kernels_h100x1_2026-12-07).
    STAGE0_FORM="measured",
    # Stage-0 block config, GELU (one accumulator), 16-bit inputs.
    STAGE0_CONFIG=(128, 256, 64, 0, 3, 8),
    # Stage-0 block config, SwiGLU (two accumulators: narrower tiles), 16-bit inputs.
    STAGE0_CONFIG_SWIGLU=(128, 128, 64, 0, 3, 8),
    # Stage-1 block config, 16-bit inputs.
    STAGE1_CONFIG=(128, 256, 64, 0, 3, 8),
    # Stage-1 block config, 16-bit inputs, for a call of one row block whose stage 1 splits K (decode sizes):
    # twice the tiles, each in half the runs (one H100, M = 16 and 128 at 2, 4 and 8 GPUs' shapes: 1.02-1.58x
    # cuBLAS vs 1.06-1.73x, bench/results/kernels_h100x1_2026-12-05/queued; narrower tiles lost at M = 512).
    STAGE1_CONFIG_DECODE=(128, 128, 64, 0, 4, 8),
    # 16-bit calls of at most this many rows run both stages in 64-row blocks (one warpgroup's MMA height):
    # half the padding rows of a 128-row block, whose MMA work the weights' stream must hide (0: off). One H100:
    # 2-8 % faster at every 16-row stage shape (bench/results/kernels_h100x1_2026-12-06/cta_few_rows/).
    FEW_ROWS=64,
    # Warps of those 64-row blocks: 8 against 4, one H100, stage 0 1.7-6.0 % faster at the three 16-row shapes,
    # stage 1 within 1.1 % (bench/results/kernels_h100x1_2026-12-06/cta_few_rows_warps/).
    FEW_ROWS_WARPS=8,
    # Stage-0 block config, GELU, float32 inputs (smaller tiles: twice the bytes per element).
    STAGE0_CONFIG_FP32=(128, 128, 32, 0, 3, 8),
    # Stage-0 block config, SwiGLU, float32 inputs.
    STAGE0_CONFIG_FP32_SWIGLU=(64, 128, 32, 0, 3, 4),
    # Stage-1 block config, float32 inputs.
    STAGE1_CONFIG_FP32=(128, 128, 32, 0, 3, 8),
    # How each stage computes its GEMM: "triton" (the pipelined kernel), "cublas" (runtime/cta_cublas.py: a GEMM
    # per row group and K-chunk, flags by stream operations) or "auto": cuBLAS where the stage's kernel measured
    # more than knobs.symm.CUBLAS_ABOVE_RATIO times cuBLAS near this shape (spec/kernel_ratios.json, kernels
    # cta_stage0 / cta_stage1: stage 1 up to 10.8x at M=16, bench/results/kernels_h200x1_2026-12-02) and the
    # cuBLAS form (cta_stage0_cublas / cta_stage1_cublas) measured faster than the kernel; either not measured
    # near the shape on this GPU: the kernel.
    STAGE0_GEMM="auto",
    STAGE1_GEMM="auto",
    # Entries per host-side cache of the op (verdicts, plans, preloaded calls); beyond it a cache starts
    # over, so a server with ever new token counts does not grow without bound.
    CACHE_MAX=4096,
)
