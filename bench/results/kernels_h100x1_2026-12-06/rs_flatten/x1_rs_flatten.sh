# One GPU: mm_rs's remote tiles in a loop flattened with the K loop (store variants tma_flatten,
# tma_subtile_flatten) and the MoE down kernel's tile loop flattened (config "flatten"), its epilogue in two column
# halves with one store. The GPU tests of mm_rs's loop first (partials arriving late, one to 24 K steps per tile),
# then mm_rs and moe_down with every variant at every shape, then the ops on the changed kernels with ranks sharing
# the GPU: a measured mm_rs variant, the MoE op at 2 ranks, the CTA op (its bulk-store barrier) at 2 ranks
# (run_stages runs in bench/).
TAILN=12 run rs_flat_test 150 env PYTHONPATH=.. python -m pytest -q -rA -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k "flattened_loop"
TAILN=32 run kernels_rs 220 python suites/bench_kernels.py --out $RES/kernels_rs --kernels mm_rs --budget-s 160
TAILN=20 run kernels_moe 120 python suites/bench_kernels.py --out $RES/kernels_moe --kernels moe_down --budget-s 80
TAILN=6 run measured_variant 60 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k measured_variant
TAILN=6 run moe_numerics 200 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider ../tests/gpu/test_gpu_moe.py -k "repeated and symm-default and ws2"
TAILN=6 run cta_graphs_ws2 90 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider ../tests/gpu/test_gpu_cta.py -k "cuda_graphs and ws2"
