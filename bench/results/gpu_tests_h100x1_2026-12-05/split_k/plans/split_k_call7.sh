# One H200 (or H100): stage 1's decode config (narrow tiles at one split row block) in the kernel benchmark beside
# the wide tiles, then the CTA op's GPU tests with it (numerics at 2 ranks, CUDA graphs at 2 and 4 ranks sharing the
# GPU; run_stages runs in bench/).
P="env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider"
TAILN=20 run kernels 150 python suites/bench_kernels.py --out $RES/kernels --kernels cta_stage1 --budget-s 100
TAILN=8 run cta_ws2 180 $P ../tests/gpu/test_gpu_cta.py -k "symm_numerics and ws2"
TAILN=6 run cta_graphs_ws2 90 $P ../tests/gpu/test_gpu_cta.py -k "cuda_graphs and ws2"
TAILN=6 run cta_graphs_ws4 100 $P ../tests/gpu/test_gpu_cta.py -k "cuda_graphs and ws4"
