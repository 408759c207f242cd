# One GPU (run_stages runs in bench/): the MoE down kernel on its candidates ((128, 256) with TMA stores, (64, 256)
# with pointer stores) and each with the other store kind (variants), call by call against torch._grouped_mm
# (installed as the H100's moe_down ratios); then the moe_experts op at 2 and 4 ranks sharing the GPU on those
# kernels (numerics, every routing; 16-bit and 32-bit tokens).
TAILN=16 run moe_down 170 python suites/bench_kernels.py --out $RES/moe_down --kernels moe_down --budget-s 130
TAILN=8 run moe_op 300 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -n 2 ../tests/gpu/test_gpu_moe.py -k "repeated and symm-default and (ws2 or ws4)"
