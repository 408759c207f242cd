# One H100 (or H200): the collective GEMMs' cuBLAS paths as the ops run them (per-chunk/band GEMMs, flag writes and
# waits, the partials' sum) against one cuBLAS GEMM; ag_mm's path again with short chunks merged
# (knobs.symm.AG_CUBLAS_MERGE_ROWS: A/B against the first run's ag_mm_cublas rows); then the CTA op's CUDA-graph
# test at 2 ranks sharing the GPU with stage 1's decode tiles (run_stages runs in bench/).
TAILN=12 run cublas_paths 300 python suites/bench_kernels.py --out $RES/kernels --kernels ag_mm_cublas,mm_rs_cublas,mm_ar_cublas --budget-s 230
TAILN=8 run ag_merge 90 python suites/bench_kernels.py --out $RES/kernels_ag_merge --kernels ag_mm_cublas --budget-s 60 --set symm.AG_CUBLAS_MERGE_ROWS=1024
P="env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider"
TAILN=6 run cta_graphs_ws2 170 $P ../tests/gpu/test_gpu_cta.py -k "cuda_graphs and ws2"
