# One GPU: the MoE op with its comm kernel on 8 SMs at 2 ranks sharing the GPU (not the default), each rank's kernels on
# (SMs - 4) // 2 SMs (support.kernel_sms). It timed out at its 14th call on a warm H100 before that split, and was cut
# by 70- and 150-s caps on a fresh H200 after it, nothing printed (compiling, or hung): here given time to compile.
TAILN=12 run moe_sm8 300 env OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=20 python -m pytest -x -s -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_moe.py -k ws2-symm-sm8
