# One H100, a fresh machine, the budget's last minutes: both CTA stages' kernels with the final split-K (one
# finishing run adds the partial sums), then the captured CTA op at 2 ranks on this GPU.
P="env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider"
TAILN=40 run kernels 120 python suites/bench_kernels.py --out $RES/kernels --kernels cta_stage0,cta_stage1 --budget-s 80
TAILN=8 run cta_graphs_ws2 110 $P ../tests/gpu/test_gpu_cta.py -k "cuda_graphs and ws2"
