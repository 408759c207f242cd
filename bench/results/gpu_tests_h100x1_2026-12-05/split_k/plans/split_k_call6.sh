# One H200, a fresh machine: the ops' cuBLAS forms (CTA stages, MoE grouped_mm) beside their kernels (the CTA
# stages with split-K at decode sizes) in one run of the kernel benchmark (its kernel_ratios.json entries of these
# kernels then replace the packaged H200 ones), the CTA op's numerics test at 2 ranks on this GPU, then the smoke
# set until the deadline (run_stages runs in bench/). Run on an H100 in bench/results/kernels_h100x1_2026-12-05
# and its split_k/ part; still to run on an H200.
SMOKE="env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu_smoke -n 3 ../tests/gpu"
P="env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider"
FORMS=cta_stage0,cta_stage0_cublas,cta_stage1,cta_stage1_cublas,moe_gate_up,moe_down,moe_grouped_mm
TAILN=30 run kernels 250 python suites/bench_kernels.py --out $RES/kernels --kernels $FORMS --budget-s 190
TAILN=8 run cta_ws2 200 $P ../tests/gpu/test_gpu_cta.py -k "symm_numerics and ws2"
for i in $(seq 1 2); do TAILN=4 run smoke$i 130 $SMOKE; done
