# One H100: the collective GEMMs' cuBLAS paths as the ops run them (per-chunk/band GEMMs, flag writes and waits,
# the partials' sum) against one cuBLAS GEMM, so the H100's choices between them and the kernels are measured as
# the H200's are (kernels_h200x1_2026-12-06/record); install with bench/tools/install_ratios.py (run_stages runs
# in bench/).
TAILN=12 run cublas_paths 300 python suites/bench_kernels.py --out $RES/kernels --kernels ag_mm_cublas,mm_rs_cublas,mm_ar_cublas --budget-s 230
