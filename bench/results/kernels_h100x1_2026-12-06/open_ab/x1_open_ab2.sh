# One GPU, one call (run_stages runs in bench/), the open A/Bs of the kernel work: mm_rs / mm_ar with their own tiles
# prefetching up to three peers' partials into L2 before the main loop (knobs.codegen.RS_PREFETCH_PARTIALS=3: every
# peer's at 2 and 4 GPUs, 3 of 7 at 8, 25 MB in flight over 132 SMs, half an H100's L2) against none (0, as set); the
# CTA stages as set and with few-row blocks up to 128 rows; the cuBLAS paths of ag_mm and mm_rs per chunk and with
# short chunks merged. Each A/B: python bench/tools/kernel_ab.py A B. The GPU tests they need follow in
# x1_open_tests.sh.
TAILN=6 run rs_as_set 95 python suites/bench_kernels.py --out $RES/rs_as_set --kernels mm_rs,mm_ar --budget-s 75 --no-variants
TAILN=6 run rs_prefetch 95 python suites/bench_kernels.py --out $RES/rs_prefetch --kernels mm_rs,mm_ar --budget-s 75 --no-variants --set codegen.RS_PREFETCH_PARTIALS=3
TAILN=6 run cta_as_set 70 python suites/bench_kernels.py --out $RES/cta_as_set --kernels cta_stage0,cta_stage1 --budget-s 50 --no-variants
TAILN=6 run cta_rows128 70 python suites/bench_kernels.py --out $RES/cta_rows128 --kernels cta_stage0,cta_stage1 --budget-s 50 --no-variants --set cta.FEW_ROWS=128
TAILN=6 run per_chunk 90 python suites/bench_kernels.py --out $RES/per_chunk --kernels ag_mm_cublas,mm_rs_cublas --budget-s 70
TAILN=6 run merged 90 python suites/bench_kernels.py --out $RES/merged --kernels ag_mm_cublas,mm_rs_cublas --budget-s 70 --set symm.AG_CUBLAS_MERGE_ROWS=256 --set symm.RS_CUBLAS_MERGE_ROWS=256
