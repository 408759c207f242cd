# One GPU (run_stages runs in bench/): the MoE down kernel with TMA stores of full consecutive tiles (the candidates)
# and with pointer stores (the variants), each config call by call against torch._grouped_mm; the moe_experts op at
# 2 ranks sharing the GPU on those kernels (numerics, every routing); ag_mm's epilogues run apart (numerics, path).
TAILN=16 run moe_down 170 python suites/bench_kernels.py --out $RES/moe_down --kernels moe_down --budget-s 130
TAILN=8 run moe_op 230 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider ../tests/gpu/test_gpu_moe.py -k "repeated and symm-default and ws2"
TAILN=20 run apart_test 170 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -s -p no:cacheprovider ../tests/gpu/test_gpu_epilogues.py -k apart
