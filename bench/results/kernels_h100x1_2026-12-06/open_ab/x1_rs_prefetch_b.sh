TAILN=3 run rs_prefetch_b 160 python suites/bench_kernels.py --out $RES/rs_prefetch_b --kernels mm_rs,mm_ar --budget-s 135 --no-variants --set codegen.RS_PREFETCH_PARTIALS=3
TAILN=3 run rs_as_set_b 160 python suites/bench_kernels.py --out $RES/rs_as_set_b --kernels mm_rs,mm_ar --budget-s 135 --no-variants
