# One GPU: the collective GEMMs' kernels (ag_mm, mm_rs, mm_ar) with every variant at every shape, the column
# order of ag_mm's peers' tiles at decode sizes and the 64-row variants in (run_stages runs in bench/).
TAILN=70 run collective 330 python suites/bench_kernels.py --out $RES/kernels --kernels ag_mm,mm_rs,mm_ar --budget-s 250
