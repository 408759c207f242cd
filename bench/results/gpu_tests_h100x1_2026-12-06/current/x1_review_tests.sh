# One GPU (run_stages runs in bench/): the GPU tests of the ops whose host path or kernel changed last, on a fresh
# machine: the MoE op at 2 and 4 ranks sharing the GPU (the down kernel's bulk-store counting), then the ops with
# fused epilogues at 2 ranks (ag_mm's whole-input path copying the own shard once per call).
TAILN=8 run moe_op 420 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -n 2 --durations=4 ../tests/gpu/test_gpu_moe.py -k "repeated and symm-default and (ws2 or ws4)"
TAILN=8 run epilogues_ws2 200 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -s -p no:cacheprovider ../tests/gpu/test_gpu_epilogues.py -k "test_ops_with_epilogues_numerics and ws2 and symm and not peer"
