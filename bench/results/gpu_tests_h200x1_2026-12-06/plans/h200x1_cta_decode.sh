# One H200 (or H100), after h200x1_kernels_queued.sh on the same machine: ag_mm's cuBLAS path with short chunks
# merged (knobs.symm.AG_CUBLAS_MERGE_ROWS; A/B against that run's ag_mm_cublas rows), then the CTA op's GPU tests
# with stage 1's decode tiles (STAGE1_CONFIG_DECODE), every rank on this GPU: CUDA graphs at 2 and 4 ranks,
# numerics at 4 ranks (run_stages runs in bench/; caps for cold compiles of the new tiles: the graph tests took
# 71-78 s warm on an H100 and did not finish in 90-100 s after the change).
TAILN=8 run ag_merge 90 python suites/bench_kernels.py --out $RES/kernels_ag_merge --kernels ag_mm_cublas --budget-s 60 --set symm.AG_CUBLAS_MERGE_ROWS=1024
P="env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider"
TAILN=6 run cta_graphs_ws2 160 $P ../tests/gpu/test_gpu_cta.py -k "cuda_graphs and ws2"
TAILN=6 run cta_graphs_ws4 160 $P ../tests/gpu/test_gpu_cta.py -k "cuda_graphs and ws4"
TAILN=8 run cta_ws4 210 $P ../tests/gpu/test_gpu_cta.py -k "symm_numerics and ws4"
