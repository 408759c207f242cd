"""Tunables of the symm lowering (read by the runtime and by the cost model).

Layout sizes (WS_MAX, MAX_BANDS, AR_MAX_ROUNDS) are not here: they are the flag layout's contract,
``overlap_backend.spec.symm_layout``. Results folders cited below hold the measurements.
"""

from .base import Knobs

symm = Knobs(
    "symm",
    # mm_ar: one-shot (push the whole partial to every peer) up to this partial size in bytes.
    ONESHOT_MAX_BYTES=4 << 20,
    # mm_ar one-shot: how the partials are summed: "triton" (one kernel that spins on the peers' flags),
    # "torch" (stream waits on the flags, then torch.sum over the [ws, M, N] slots), "auto" (torch where the
    # kernel ratios say the kernel loses at the shape: 0.032-0.033 ms against torch.sum's 0.015-0.018,
    # bench/results/kernels_h200x1_2026-12-02). Generated epilogues stay in the kernel.
    ONESHOT_SUM="auto",
    # mm_ar: at least this many rows per chunk and round, so that each stays an efficient GEMM.
    AR_ROWS_PER_CHUNK=512,
    # Chunks travel in bands of at least this many rows; a multiple of every kernel block height (BM).
    BAND_ROWS_MIN=512,
    # Process-group backends symm serves: its data path never calls the group's collectives (set-up uses
    # all_gather_object), so tests add "gloo" to run ranks sharing one GPU (OVERLAP_TEST_SHARED_GPU).
    GROUP_BACKENDS=("nccl",),
    # GroupState.data_view's cache of views over the data buffer, per group: bounded for dynamic shapes.
    MAX_VIEWS=64,
    # ag_mm / mm_rs plans (their per-key decisions) and preloaded kernel-variant keys kept: bounded for dynamic
    # shapes, whose every length is a key.
    MAX_PLANS=256,
    # The stream-wait watchdog declares a call dead this many OVERLAP_TIMEOUT_S after it started...
    WATCHDOG_FACTOR=1.25,
    # ...plus this many seconds: later than the kernels' own bounded waits, whose reports say more.
    WATCHDOG_SLACK_S=0.25,
    # Pushes to different peers on streams of their own (so on different copy engines at once); one push
    # stream made mm_rs 0.303 ms vs its kernel's 0.205 at 4 GPUs (bench/results/collective_gemm_h200x4_2026-11-30),
    # but per-peer streams are not measured on 4 GPUs yet: off (no effect at 2 ranks).
    PUSH_STREAM_PER_PEER=False,
    # SMs the persistent kernels of a group's ranks sharing a GPU leave free, all together (there the driver's copies
    # run on SMs; each rank holds an equal share of the rest): with all 132 held by mm_ar's rounds kernel both ranks
    # hung, 4 free fixed it (bench/results/gpu_tests_h200x1_2026-12-01/mm_ar_hang).
    SHARED_DEVICE_FREE_SMS=4,
    # How mm_rs / mm_ar ship partials: "ce" (stage, then the copy engine per band) or "peer" (the epilogue
    # stores into the owner's buffer); peer stores won only below ~32 MiB shipped per call (docs/results.md).
    TRANSPORT="ce",
    # How mm_rs computes its partials where rs_gemm allows it: "cublas" (a GEMM per band) is alike on the GPU
    # and costs less host time than "triton" (the persistent kernel) in eager calls
    # (bench/results/collective_gemm_h200x2_2026-11-30/mm_rs_cublas).
    MM_RS_GEMM="cublas",
    # mm_rs on cuBLAS only from this much local K: below it the transfer dominates and the kernel won.
    RS_CUBLAS_MIN_K=2048,
    # Chunks made of runs shorter than this (many tiny GEMMs) stay on the kernel.
    RS_CUBLAS_MIN_RUN=128,
    # Each cuBLAS-path band costs ~150 us of host time, so bands hold at least this much GEMM work (M=4096:
    # one band 0.470-0.510 ms vs four of 512 rows 0.696-0.899,
    # bench/results/collective_gemm_h200x2_2026-11-30/mm_rs_cublas).
    RS_CUBLAS_BAND_FLOPS=64e9,
    # mm_rs's cuBLAS path with whole-row chunks of fewer rows than this (decode sizes): the peers' chunks in one
    # GEMM per contiguous range of them (those after this rank's, then those before it), their done flags raised
    # after it, instead of a GEMM per chunk (each reads the whole weight); 0: a GEMM per chunk. 256: the path at
    # the 512-token shapes 5.44x -> 3.56x one cuBLAS GEMM (8 GPUs) and 2.49x -> 2.16x (4 GPUs), the others as before
    # (one H100, bench/results/kernels_h100x1_2026-12-06/open_ab).
    RS_CUBLAS_MERGE_ROWS=256,
    # Captured calls' band floor (None: RS_CUBLAS_BAND_FLOPS): finer bands won at M=4096 and 16384 but lost at
    # M=8192 in replays (bench/results/collective_gemm_h200x2_2026-11-30/mm_rs_cublas): an open question.
    RS_CUBLAS_BAND_FLOPS_CAPTURED=None,
    # The mm_rs kernel's TMA variants where they apply: "on" (tuning candidates next to the pointer-store
    # configs; faster at 3 of 4 shapes on one H200, bench/results/kernels_h200x1_2026-12-01/mm_rs_kernel), "only"
    # (the only candidates: tests), "off".
    RS_TMA="on",
    # mm_ar's rounds kernel with the same TMA variants (staged tiles, the own tiles' partials and stores; its copy
    # into the gather region stays a pointer store), as RS_TMA. Not with AR_KERNEL_COPY_OUT or peer stores. Off: on
    # one H100 it ran right and no faster at 2 of the kernel benchmark's 9 mm_ar shapes
    # (bench/results/kernels_h100x1_2026-12-07/ar_tma); not yet run in the op on a GPU.
    AR_TMA="off",
    # mm_ar's rounds kernel copies the peers' reduced bands into the output itself instead of the copy
    # stream: correct under the interpreter, off until it is timed on several GPUs.
    AR_KERNEL_COPY_OUT=False,
    # How ag_mm computes where ag_gemm allows it: "cublas" (a GEMM per chunk and weight) measured ahead of
    # "triton" (the consumer kernel) back to back at every shape, replayed at 4 of 6, on 2xH200
    # (bench/results/collective_gemm_h200x2_2026-12-01/ag_mm_cublas).
    AG_MM_GEMM="cublas",
    # ag_mm on cuBLAS only with at least this many output columns in all.
    AG_CUBLAS_MIN_N=0,
    # ag_mm gathered along an inner dimension: on cuBLAS only with runs of at least this many rows.
    AG_CUBLAS_MIN_RUN=128,
    # ag_mm's cuBLAS path with whole-row chunks of fewer rows than this: the own chunk's GEMM, then, once every
    # peer's chunk arrived, one GEMM per contiguous range of them (each chunk's GEMM reads the whole weight, which
    # bounds it below a few hundred rows); 0: a GEMM per chunk as it arrives. 256: the path at the 512-token shapes
    # 4.11x -> 1.56x one cuBLAS GEMM (8 GPUs) and 2.12x -> 1.33x (4 GPUs), the others as before (one H100,
    # bench/results/kernels_h100x1_2026-12-06/open_ab).
    AG_CUBLAS_MERGE_ROWS=256,
    # ag_mm / mm_rs / mm_ar compute a GEMM on cuBLAS where the op's Triton kernel measured more than this many
    # times cuBLAS's time on it (fused epilogue: cuBLAS plus the separate epilogue kernel) in the kernel ratios
    # (spec/kernel_ratios.py, written by bench/suites/bench_kernels.py) and the op's cuBLAS path, where measured
    # there too, faster than the kernel; on the kernel where that path measured slower; None: the shape rules alone.
    CUBLAS_ABOVE_RATIO=1.03,
    # ag_mm on its kernel runs a generated epilogue apart (the kernel plain, the epilogue's torch step after it)
    # where that measured at least this fraction faster than the epilogue fused into the kernel's tiles (the
    # kernel benchmark's apart_ratio against ratio, over the same cuBLAS-plus-epilogue baseline); None: always fused.
    EPILOGUE_APART_GAIN=0.01,
    # A measured ratio stands for a GEMM within this distance of its shape (log2 units over M, K, N and the
    # world size): a shape farther from every measured one keeps the shape rules.
    KERNEL_RATIO_MAX_DISTANCE=1.0,
    # The kernel-ratio file (None: the one in the package, spec/kernel_ratios.json).
    KERNEL_RATIOS_FILE=None,
    # Calls made during a CUDA-graph capture run on symm with the toggling flag block (else on p2p, whose
    # NCCL calls are captured): on since the captured path passed on 2xH200 (tests/gpu/test_gpu.py).
    CAPTURE_ON_SYMM=True,
    # Eager ag_mm / mm_rs / mm_ar / cta_pipeline_mlp / moe_experts calls replay a private CUDA graph of the op per argument key
    # and tensor addresses from a key's third call on (runtime/symm/private_graphs.py): one launch instead of the
    # op's host work.
    PRIVATE_GRAPHS=True,
    # Private graphs kept per key (one per set of addresses: a model's layers share a key; or per output
    # still referenced) ...
    PRIVATE_GRAPHS_PER_KEY=128,
    # ... and in all (each holds its outputs and intermediates in a memory pool of its own).
    PRIVATE_GRAPHS_MAX=64,
    # ... and by the output memory their pools hold (MiB per process; one graph may go over it): least
    # recently used idle graphs are dropped first, and none is captured while every graph is busy.
    PRIVATE_GRAPHS_MAX_MIB=2048.0,
    # A key whose graphs were evicted this many times while replayed less often than captured stops capturing.
    PRIVATE_GRAPH_CAPTURES_MIN=8,
)
