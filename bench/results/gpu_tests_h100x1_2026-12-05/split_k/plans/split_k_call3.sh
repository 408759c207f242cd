# One H200 (or H100), a fresh machine: the CTA stages' split-K runs at decode sizes. The kernel benchmark of
# both stages (op: the plan's runs; variants: no split, narrower tiles), then the CTA op's GPU tests with every
# rank on this one GPU (the plan splits at most of their shapes), eager and captured (run_stages runs in bench/).
P="env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider"
TAILN=64 run kernels 170 python suites/bench_kernels.py --out $RES/kernels --kernels cta_stage0,cta_stage1 --budget-s 120
TAILN=8 run cta_ws2 200 $P ../tests/gpu/test_gpu_cta.py -k "symm_numerics and ws2"
TAILN=8 run cta_ws4 160 $P ../tests/gpu/test_gpu_cta.py -k "symm_numerics and ws4"
TAILN=8 run cta_graphs_ws2 90 $P ../tests/gpu/test_gpu_cta.py -k "cuda_graphs and ws2"
