# One GPU (any card), a fresh machine: the kernel benchmark of record on today's code, every kernel with every variant (the
# Gluon forms of ag_mm and mm_rs included), the cuBLAS paths and forms and the fused ag_mm rows' epilogue-apart path,
# each config call by call against cuBLAS. Afterwards: python
# bench/tools/install_ratios.py DIR and python bench/suites/kernel_paths.py DIR.
TAILN=14 run kernels 530 python bench/suites/bench_kernels.py --out $RES/kernels --budget-s 440
