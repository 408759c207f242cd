# One GPU, one call (run_stages runs in bench/), the open A/Bs of the kernel work and the GPU test they need:
# the CTA stages as set and with few-row blocks up to 128 rows (x1_cta_few_rows_128.sh); the cuBLAS paths of ag_mm
# and mm_rs per chunk and with short chunks merged (x1_cublas_merge.sh); then the CTA op at 2 ranks sharing the GPU
# (few-row calls in 64-row blocks of 8 warps, as set; the benches warmed Triton's cache). Each A/B:
# python bench/tools/kernel_ab.py A B.
TAILN=6 run cta_as_set 70 python suites/bench_kernels.py --out $RES/cta_as_set --kernels cta_stage0,cta_stage1 --budget-s 50 --no-variants
TAILN=6 run cta_rows128 70 python suites/bench_kernels.py --out $RES/cta_rows128 --kernels cta_stage0,cta_stage1 --budget-s 50 --no-variants --set cta.FEW_ROWS=128
TAILN=6 run per_chunk 90 python suites/bench_kernels.py --out $RES/per_chunk --kernels ag_mm_cublas,mm_rs_cublas --budget-s 70
TAILN=6 run merged 90 python suites/bench_kernels.py --out $RES/merged --kernels ag_mm_cublas,mm_rs_cublas --budget-s 70 --set symm.AG_CUBLAS_MERGE_ROWS=256 --set symm.RS_CUBLAS_MERGE_ROWS=256
TAILN=8 run cta_ws2 200 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -s -p no:cacheprovider ../tests/gpu/test_gpu_cta.py -k "symm_numerics and ws2"
