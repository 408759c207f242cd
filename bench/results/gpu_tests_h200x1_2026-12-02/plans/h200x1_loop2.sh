# One H200, ranks sharing it: moe_experts on torch._grouped_mm (and the regression of the MoE captured-call
# checks), then the smoke set in a loop until the deadline (run_stages runs in bench/).
SMOKE="env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu_smoke -n 3 ../tests/gpu"
TAILN=40 run moe_grouped 240 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -n 2 ../tests/gpu/test_gpu_moe_grouped.py
TAILN=12 run moe_regress 150 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -n 2 ../tests/gpu/test_gpu_moe.py -k "captured or (repeated and ws2 and default)"
for i in $(seq 1 6); do TAILN=4 run smoke$i 140 $SMOKE; done
