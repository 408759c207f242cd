# One GPU (run_stages runs in bench/): the CTA stage kernels at every shape with the 64-row blocks of few-row calls
# in 4 warps (as set), then in 8 (--set cta.FEW_ROWS_WARPS=8), each config call by call against cuBLAS.
TAILN=8 run warps4 70 python suites/bench_kernels.py --out $RES/warps4 --kernels cta_stage0,cta_stage1 --budget-s 50 --no-variants
TAILN=8 run warps8 70 python suites/bench_kernels.py --out $RES/warps8 --kernels cta_stage0,cta_stage1 --budget-s 50 --no-variants --set cta.FEW_ROWS_WARPS=8
