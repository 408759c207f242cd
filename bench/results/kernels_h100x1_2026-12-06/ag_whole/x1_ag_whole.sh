# One GPU (run_stages runs in bench/): ag_mm at 8 GPUs' shapes, where the decode size's 64-row chunks now take the
# kernel that reads the whole gathered input (each config call by call against cuBLAS); the GPU tests of that
# kernel with every variant and late shards, and of the decode tile orders; the GPU smoke set (every symm op at
# 2 ranks sharing the GPU, small shapes: the whole-input kernel through the op).
TAILN=14 run ag_mm_ws8 150 python suites/bench_kernels.py --out $RES/ag_ws8 --kernels ag_mm --ws 8 --budget-s 110
TAILN=8 run whole_test 150 env PYTHONPATH=.. python -m pytest -q -rA -p no:cacheprovider ../tests/gpu/test_gpu_kernel_variants.py -k "whole or decode"
TAILN=8 run smoke 150 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -n 3 -m gpu_smoke ../tests/gpu
