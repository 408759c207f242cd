"""Tunables of the Triton kernels' layer (``codegen/``): block configs, tuning, launches."""

from .base import Knobs

codegen = Knobs(
    "codegen",
    # Block configs (BM, BN, BK, GROUP_M, num_stages, num_warps, tma_store) the 16-bit GEMM kernels are
    # tuned over; the first (taken without tuning) won the tuning at every size bench/probe_symm.py timed
    # on H200, at ~cuBLAS speed (docs/results.md).
    CANDIDATES_16BIT=(
        (128, 256, 64, 8, 3, 8, False),
        (128, 128, 64, 8, 4, 8, False),
        (128, 128, 64, 8, 4, 4, False),
        (64, 256, 64, 8, 4, 4, False),
    ),
    # The float32 GEMM kernels' candidates, as above (the first is taken without tuning).
    CANDIDATES_32BIT=(
        (128, 128, 32, 8, 3, 8, False),
        (64, 128, 32, 8, 3, 4, False),
    ),
    # The first this many candidates are also tried with a TMA-store epilogue where the kernel can use
    # one: each variant is one more compilation on the first call.
    TMA_STORE_VARIANTS=2,
    # More candidates of the ag_mm consumer / mm_rs producer (mm_ar rounds included), measured by
    # bench/suites/bench_kernels.py next to the ones above: other stage / warp / GROUP_M choices and the store
    # variants of codegen/configs.py (TMA stores with the epilogue in two halves, a warp-specialized or flattened
    # tile loop; a flattened 128x256 tile fits 4 stages in shared memory only with the subtiled epilogue; 64-row
    # tiles for decode sizes' short chunks; the warp-specialized Gluon kernels, one warpgroup per partition
    # (num_warps 4): ag_mm's ping-pong on 128x128 tiles in a ring of 4 stages and cooperative on 128x256 in 3,
    # mm_rs's ping-pong with TMA staging, the faster of its two staging forms at most shapes on one H100, and its
    # cooperative form on 128x256 tiles, faster than the op's best at 16 of 26 shapes there).
    VARIANTS_16BIT={
        "ag_mm": (
            (128, 256, 64, 8, 3, 8, "tma_subtile"),
            (128, 256, 64, 8, 4, 8, "tma_subtile"),
            (128, 256, 64, 8, 3, 8, "tma_ws"),
            (128, 256, 64, 16, 3, 8, True),
            (128, 128, 64, 8, 5, 8, True),
            (128, 256, 64, 8, 3, 8, "tma_flatten"),
            (128, 256, 64, 8, 4, 8, "tma_subtile_flatten"),
            (128, 128, 64, 8, 4, 8, "tma_flatten"),
            (64, 256, 64, 8, 4, 8, False),
            (64, 128, 64, 8, 6, 4, False),
            (128, 128, 64, 8, 4, 4, "ws_pingpong"),
            (128, 256, 64, 8, 3, 4, "ws_coop"),
        ),
        "mm_rs": (
            (128, 256, 64, 8, 3, 8, "tma_subtile"),
            (128, 256, 64, 8, 4, 8, "tma_subtile"),
            (128, 256, 64, 16, 3, 8, True),
            (128, 128, 64, 8, 5, 8, True),
            (128, 256, 64, 4, 3, 8, False),
            (64, 256, 64, 8, 4, 8, False),
            (128, 128, 64, 8, 4, 4, "ws_pingpong"),
            (128, 256, 64, 8, 3, 4, "ws_coop"),
        ),
        "moe_down": (
            (128, 128, 64, 8, 4, 4, "ws_pingpong"),
            (128, 256, 64, 8, 3, 4, "ws_coop"),
            (64, 256, 64, 8, 4, 4, "ws_pingpong"),
        ),
    },
    # The Gluon kernels run a generated epilogue on their tile in shared memory, this many values a thread at a
    # time, in a loop over the pieces of the tile: on the accumulator's registers, 128 values a thread, bias + erf
    # GELU spilled; more values a piece make a larger loop body (bias + GELU: ~70 instructions a value), fewer a
    # longer loop. 0: on the registers.
    GLUON_EPILOGUE_VALUES=16,
    # At most this many CTAs of the ag_mm consumer / mm_rs producer (mm_ar rounds included) on one SM, as many as
    # the compiled config lets one SM hold (registers, shared memory), so that one CTA's loads, waits and stores
    # overlap another's. 1: the configs above hold one per SM anyway; tiles small enough for two (128x128 in 2
    # stages, 64x128 in 3) ran 0.59-0.70x their one-per-SM time with 2 and still 1.35-2.1x cuBLAS, slower than
    # the 128x256 tiles at every shape of the kernel benchmark (one H100).
    PERSISTENT_CTAS_PER_SM=1,
    # ag_mm takes the peers' tiles column block by column block (every chunk's row tiles of one block of the
    # weight in turn: the block read once from memory, then from L2) where a chunk has at most this many rows;
    # chunk by chunk in arrival order above. 0: never.
    AG_MM_PEERS_BY_COLUMN_ROWS=128,
    # ag_mm reads the gathered input as one matrix (the own shard copied into its slot, every peer waited for
    # before a CTA's first tile: codegen/ag_mm.py's whole kernel) where a chunk has at most this many rows: decode
    # sizes, where a chunk is shorter than a 128-row tile (8 GPUs' 512-token shape on an H100: 1.56x -> 1.06x
    # cuBLAS, bench/results/kernels_h100x1_2026-12-06/ag_whole). 0: never.
    AG_MM_WHOLE_ROWS=64,
    # Pipeline stages of the loop in which mm_rs's / mm_ar's own tiles load the peers' partials (TMA loads of
    # [BM, BN] tiles; this minus one in flight, in shared memory the main loop has left): 1 loads one at a time.
    # Two in flight (3) measured neutral on one H100 (kernels alone, geo-mean 0.997x the time, -8 % to +8 % per
    # shape; bench/results/kernels_h100x1_2026-12-06/rs_partials), where every SM loads at once; untried with
    # the peers' traffic of real GPUs.
    RS_PARTIAL_STAGES=1,
    # mm_rs's tiles span several chunks where a chunk is shorter than a tile (decode sizes: BM a multiple of the
    # chunk's rows, BM / rows dividing the group): a 128-row tile covers two 64-row chunks instead of computing 64
    # rows it throws away, its remote chunks staged and counted, its own chunk's rows summed with the peers'
    # partials. Off (every tile within one chunk) until it is run and timed on a GPU.
    RS_SPAN_CHUNKS=False,
    # Tune the ops over VARIANTS_16BIT too (each one more compilation on a shape's first call): off, as no
    # variant wins at most shapes (the kernel benchmark); MEASURED_VARIANT_GAIN takes the winners shape by shape.
    TUNE_VARIANTS=False,
    # Where the kernel benchmark's fastest variant at the nearest measured shape of this GPU (spec/kernel_ratios.json:
    # best_config) was at least this fraction faster than the candidates above, ag_mm / mm_rs / mm_ar tune over
    # it too (one more compilation) and their GEMM choices read its ratio; None: never.
    MEASURED_VARIANT_GAIN=0.01,
    # Per kernel, store fields of bench-only variants its op does not adopt (plain or fused). Empty: the Gluon
    # kernels, held back while ag_mm's computed wrong tiles in the op at 2 ranks (stale TMA descriptors in its worker
    # partitions, since made by each partition, gluon_ring.partition_descriptor), ran right in the op twice over at 2
    # ranks on one H100, both forms, fused and plain (tests/gpu/test_gpu_kernel_variants.py).
    VARIANTS_NOT_ADOPTED={},
    # Time the candidates and keep the fastest; False takes the first fitting one (tests: numerics do
    # not depend on the config, and it is one compilation per kernel variant).
    AUTOTUNE=True,
    # Rounds of that timing, every candidate once per round, alternately in list order and reversed, each
    # candidate scored by its mean: the GPU's clock drifts under a sustained GEMM load (the same cuBLAS GEMM
    # 0.60 then 0.69 ms a second later on an H100), and a drift linear over the tuning then falls alike on
    # every candidate instead of on the later ones.
    TUNE_ROUNDS=2,
    # Launch a kernel variant seen before through its compiled launcher, skipping Triton's per-launch
    # binding (tens of microseconds per launch of the 30-40-argument kernels: codegen/launcher.py).
    FAST_LAUNCH=True,
    # moe_experts' gate/up kernel's candidates (two [BM, BN] float32 accumulators): (128, 128) at Mixtral-/DeepSeek-like
    # prefill sizes, in four stages (2-3 % faster than three at all 7 prefill shapes, 0.95-1.06x torch._grouped_mm),
    # and (64, 256) at decode sizes (the fastest at 5 of 6); few on purpose, as each one is a compilation on the
    # first call (a fresh machine spent > 190 s compiling seven). Six configs, each call by call against
    # torch._grouped_mm: bench/results/kernels_h100x1_2026-12-06/moe_configs.
    MOE_GATE_UP_16BIT=(
        (128, 128, 64, 8, 4, 8, False),
        (64, 256, 64, 8, 3, 8, False),
    ),
    # moe_experts' down kernel's candidates: (128, 256) at prefill sizes, its row tiles in groups of 16 (1.5-7 %
    # faster than 8 at the 4 DeepSeek-like shapes, within 2 % at the Mixtral-like ones; none of nine configs
    # closes DeepSeek's 1.08-1.25x), its full tiles stored by TMA (2.5-5.4 % faster at the DeepSeek-like shapes,
    # where K = 2048 leaves the pointer stores a seventh of a tile's time; within 1 % at the Mixtral-like ones);
    # (64, 256) for decode sizes, where a (source, expert) group holds ~32 rows and 128-row tiles compute four
    # times the rows they store (the fastest at 5 of 6 decode shapes), by pointer stores (TMA 1-2 % slower at 5
    # of 6). bench/results/kernels_h100x1_2026-12-06/moe_configs and moe_down_tma.
    MOE_DOWN_16BIT=(
        (128, 256, 64, 16, 3, 8, True),
        (64, 256, 64, 8, 3, 8, False),
    ),
    # The single-CTA MoE plan kernel (codegen/moe_plan.py) takes at most this many grouped rows: beyond,
    # the torch version's GPU time is shorter and its host time hides behind the GPU's.
    MOE_PLAN_MAX_ROWS=8192,
)
