# One GPU, ranks sharing it: the Gluon kernels with every partition making the TMA descriptors it copies through
# (gluon_ring.partition_descriptor). The ops at 2 ranks running both Gluon kernels in both forms (ag_mm plain and with
# a fused bias + GELU, mm_rs), three times over (before: a wrong ag_mm result in 2 of 4 such calls), then their GPU tests;
# then CTA stage 1 at decode sizes and the ops storing tiles into peers in 16-byte vectors.
TAILN=12 run measured_variant 200 bash -c 'for i in 1 2 3; do env OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -s -p no:cacheprovider -m gpu tests/gpu/test_gpu_kernel_variants.py -k measured_variant 2>&1 | grep -E "rel errs|passed|failed|PASS|FAIL|XPASS"; done'
TAILN=8 run ws_tests 200 python -m pytest -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_kernel_variants.py -k "(ws_ or gluon) and not measured_variant"
# CTA stage 1 at decode sizes with its 7 peer copies of a tile in 16-byte vectors (tiles.peer_buffer; 2-byte stores
# before: 1.01-1.42x cuBLAS in cta1_decode_s4 of kernels_h100x1_2026-12-07).
TAILN=8 run cta1_vector_peers 60 python bench/suites/bench_kernels.py --kernels cta_stage1 --max-rows 128 --no-variants --budget-s 50 --out $RES/cta1_vector_peers
# The ops whose kernels store tiles into peers' buffers, now in 16-byte vectors: mm_rs / mm_ar by peer stores, the
# CTA op by peer stores (and its stage 1's copies of Y), the MoE op's comm kernel, at 2 ranks.
TAILN=6 run peer_vectors 150 env OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu.py tests/gpu/test_gpu_cta.py tests/gpu/test_gpu_moe.py -k "(cuda_graphs and ws2) or (ws2 and symm-peer and numerics) or ws2-symm-sm8"
