# One GPU, ranks sharing it (run_stages runs in bench/): the ops with fused epilogues at 2 ranks on symm (ag_mm's
# cases of at most 64 rows per rank take the whole-input kernel with the generated epilogue), then every kernel
# variant's GPU test (the measured-variant op test left out: it needs a GPU per rank).
TAILN=14 run epilogues_ws2 200 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -s -p no:cacheprovider ../tests/gpu/test_gpu_epilogues.py -k "test_ops_with_epilogues_numerics and ws2 and symm and not peer"
TAILN=6 run variants_test 150 env PYTHONPATH=.. python -m pytest -q -rA -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k "not measured_variant"
