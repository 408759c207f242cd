# One H200, a fresh machine: the ops' cuBLAS forms (CTA stages, MoE grouped_mm) beside their kernels in one run
# of the kernel benchmark (its kernel_ratios.json entries of these kernels then replace the packaged ones), then
# the smoke set (cold for its kernels) until the deadline (run_stages runs in bench/). Run on an H100 in
# bench/results/kernels_h100x1_2026-12-05; still to run on an H200.
SMOKE="env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu_smoke -n 3 ../tests/gpu"
FORMS=cta_stage0,cta_stage0_cublas,cta_stage1,cta_stage1_cublas,moe_gate_up,moe_down,moe_grouped_mm
TAILN=30 run kernels 250 python suites/bench_kernels.py --out $RES/kernels --kernels $FORMS --budget-s 190
for i in $(seq 1 4); do TAILN=4 run smoke$i 130 $SMOKE; done
