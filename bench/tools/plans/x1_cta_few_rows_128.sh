# One GPU (run_stages runs in bench/): the CTA stage kernels at every shape as set, then with the 64-row blocks of
# few-row calls up to 128 rows (--set cta.FEW_ROWS=128: at M = 128 two row blocks, stage 1 on its narrow decode tiles,
# each tile in fewer split-K runs, so the finishing run reads fewer partial slots), each config call by call against
# cuBLAS (op configs only, each checked against float32). Kept only if M = 128 gains and nothing else moves; then
# the CTA op's GPU test at that setting before it is installed.
TAILN=8 run as_set 70 python suites/bench_kernels.py --out $RES/as_set --kernels cta_stage0,cta_stage1 --budget-s 50 --no-variants
TAILN=8 run rows128 70 python suites/bench_kernels.py --out $RES/rows128 --kernels cta_stage0,cta_stage1 --budget-s 50 --no-variants --set cta.FEW_ROWS=128
