# One GPU (run_stages runs in bench/): the cuBLAS paths of ag_mm and mm_rs at every shape as set (a GEMM per chunk),
# then with short chunks merged (knobs.symm.AG_CUBLAS_MERGE_ROWS / RS_CUBLAS_MERGE_ROWS = 256: the peers' chunks
# of fewer rows in one GEMM per contiguous range; decode sizes at 4 and 8 GPUs), each path call by call against
# cuBLAS's one GEMM. Kept where the decode shapes gain; then re-recorded with the kernels (x1_record_current.sh).
TAILN=8 run per_chunk 90 python suites/bench_kernels.py --out $RES/per_chunk --kernels ag_mm_cublas,mm_rs_cublas --budget-s 70
TAILN=8 run merged 90 python suites/bench_kernels.py --out $RES/merged --kernels ag_mm_cublas,mm_rs_cublas --budget-s 70 --set symm.AG_CUBLAS_MERGE_ROWS=256 --set symm.RS_CUBLAS_MERGE_ROWS=256
