# One H200 (or H100): the CTA op's GPU tests at 4 ranks with stage 1's decode tiles (STAGE1_CONFIG_DECODE),
# every rank on this GPU: CUDA graphs, then numerics (run_stages runs in bench/; caps for cold compiles of the
# new tiles: the 2-rank graph test took 64 s on an H200, gpu_tests_h200x1_2026-12-06).
P="env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider"
TAILN=6 run cta_graphs_ws4 200 $P ../tests/gpu/test_gpu_cta.py -k "cuda_graphs and ws4"
TAILN=8 run cta_ws4 250 $P ../tests/gpu/test_gpu_cta.py -k "symm_numerics and ws4"
