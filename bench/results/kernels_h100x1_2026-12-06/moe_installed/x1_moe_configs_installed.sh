# One GPU (run_stages runs in bench/): the MoE GEMMs with their new candidates (gate/up in four stages, down with
# GROUP_M 16) and the grouped_mm form, each config call by call against torch._grouped_mm (installed as the H100's
# MoE ratios), then the moe_experts op at 2 ranks sharing the GPU on those kernels (numerics, every routing).
TAILN=8 run moe_kernels 290 python suites/bench_kernels.py --out $RES/moe_kernels --kernels moe_gate_up,moe_down,moe_grouped_mm --budget-s 250
TAILN=8 run moe_op 110 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider ../tests/gpu/test_gpu_moe.py -k "repeated and symm-default and ws2"
