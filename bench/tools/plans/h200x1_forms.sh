# One H200, a fresh machine: the kernel benchmark of record, every kernel with the ops' cuBLAS forms (CTA stages,
# MoE grouped_mm) beside their kernels (its kernel_ratios.json can then replace the packaged one), then the smoke set (cold for
# its kernels) until the deadline (run_stages runs in bench/). Next, on the same warm machine: h200x1_loop.sh.
SMOKE="env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu_smoke -n 3 ../tests/gpu"
TAILN=40 run kernels 370 python suites/bench_kernels.py --out $RES/kernels --budget-s 300
for i in $(seq 1 2); do TAILN=4 run smoke$i 120 $SMOKE; done
