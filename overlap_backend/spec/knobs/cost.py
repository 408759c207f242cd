"""Tunables of the cost model (``overlap_backend/cost/model.py``): its margin, the constants fitted on the
bench tables (docs/cost_model.md says which number comes from which table) and its search spaces."""

from .base import Knobs

cost = Knobs(
    "cost",
    # Rewrite only where the predicted op time is below (1 - MARGIN) x the plain one: the bench's
    # run-to-run differences are 2-5%, so a smaller predicted win is within the model's error.
    MARGIN=0.03,
    # Persistent Triton TMA GEMM time / cuBLAS (docs/architecture.md: 0.97-1.05x; bench/probe_symm.py: 1.00-1.12x).
    TRITON_EFF=1.04,
    # Chunk GEMMs next to NCCL's send/recv kernels, and chunked GEMMs themselves, run this much slower
    # (fitted: ours p2p at large shapes).
    P2P_GEMM_SLOWDOWN=1.15,
    # Back-to-back GEMM + collective take this fraction of their separate times (fitted: median of 52 rows).
    SEQ_FACTOR=0.93,
    # NCCL all-reduce bus bandwidth / all-gather's (fitted: the NCCL all-reduce columns).
    AR_BUSBW_GAIN=1.15,
    # Device time of a symm call beyond its GEMM and transfers: flag waits, the first tile wave's wait,
    # stream operations (fitted: ours symm ag_mm, the gap to TRITON_EFF x mm).
    SYMM_DEVICE_MS=0.03,
    # A CTA-pipeline stage (flag waits per K-chunk, chunk-major A) / cuBLAS (fitted: cta_ws2, M >= 512).
    CTA_EFF=1.10,
    # Fraction of the SMs whose weight loads reach the memory bandwidth: at small M stage 1 streams all of
    # W2 with one CTA per tile, 32 tiles at M <= 128 (fitted: cta_ws2 graph replays at M = 16 / 128,
    # 2xH200, bench/results/cta_h200x2_2026-11-30/eager_graphs: 0.326-0.334 ms GELU, 0.396-0.415 SwiGLU).
    CTA_BW_SMS=0.43,
    # The moe baseline's grouped experts (torch._grouped_mm x3 + silu*up, the row gather and scatter) /
    # the model's cuBLAS-rate GEMMs: 1.09-1.20 once the gather/scatter traffic is counted, compute-bound
    # side only (fitted on bench/results/moe_h200x2_2026-11-30/grouped_raster/moe_ws2.json, 2xH200).
    BASE_GROUPED_EFF=1.14,
    # The moe symm expert GEMMs' time / the model's experts time on rows padded to whole MOE_TILE_ROWS
    # tiles per (source, expert) group: all four rows within 4% (the kernels before the grouped raster,
    # bench/results/moe_h200x2_2026-11-30/first_runs: 1.45).
    MOE_SYMM_EFF=1.05,
    # Rows of the tiles the moe symm rows are padded to, per (source, expert) group (the fit of MOE_SYMM_EFF).
    MOE_TILE_ROWS=128,
    # What one SM of the moe comm kernel copies locally out of the combine slots, GB/s: not fitted (in every
    # measured row the copy-out ended under the own rows' GEMMs), taken as ~3x the peer-store rate of
    # 4.5 GB/s per SM (bench/results/moe_h200x2_2026-11-30/first_runs), the ratio of NVLink to local HBM latency.
    SM_PULL_GBPS=15.0,
    # Candidates of the moe symm communication SM count (OVERLAP_MOE_COMM_SMS=auto); 0: no comm kernel,
    # the copy engine copies the results out (2xH200: 4% faster than 8 SMs DeepSeek-like, 2% Mixtral-like).
    MOE_COMM_SMS=(0, 4, 8, 16, 32),
    # Candidates of the cta_pipeline p2p stage count (OVERLAP_CTA_STAGES=auto).
    CTA_STAGES=(1, 2, 4, 8),
)
