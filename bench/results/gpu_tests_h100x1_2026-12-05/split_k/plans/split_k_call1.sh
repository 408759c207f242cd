# One H200 (or H100), a fresh machine: stage 1's split-K runs at decode sizes. The kernel benchmark of the CTA
# stages (op: the plan's split, variants: none and 128-column tiles; stage 0's narrower tiles as variants),
# their cuBLAS forms and the MoE GEMMs; then the CTA op's GPU tests, every rank on this one GPU (the plan
# splits stage 1 at most of their shapes), eager and captured (run_stages runs in bench/).
P="env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider"
FORMS=cta_stage0,cta_stage0_cublas,cta_stage1,cta_stage1_cublas,moe_gate_up,moe_down,moe_grouped_mm
TAILN=30 run kernels 250 python suites/bench_kernels.py --out $RES/kernels --kernels $FORMS --budget-s 190
TAILN=8 run cta_ws2 120 $P ../tests/gpu/test_gpu_cta.py -k "symm_numerics and ws2"
TAILN=8 run cta_graphs_ws2 100 $P ../tests/gpu/test_gpu_cta.py -k "cuda_graphs and ws2"
TAILN=8 run cta_ws4 150 $P ../tests/gpu/test_gpu_cta.py -k "symm_numerics and ws4"
