# One GPU: the ag_mm consumer kernel with every variant, the flattened tile loops (tma_flatten,
# tma_subtile_flatten) among them, at every shape of the kernel benchmark (run_stages runs in bench/).
TAILN=40 run ag_mm 330 python suites/bench_kernels.py --out $RES/kernels --kernels ag_mm --budget-s 240
