# One GPU (run_stages runs in bench/): the CTA stage kernels at every shape, first with knobs.cta.FEW_ROWS=0 (the
# 128-row blocks of before), then as set (calls of at most 64 rows in 64-row blocks of 4 warps), each config call
# by call against cuBLAS; then the CTA op's numerics at 2 ranks sharing the GPU (a 40-row SwiGLU case among them).
TAILN=14 run before 125 python suites/bench_kernels.py --out $RES/before --kernels cta_stage0,cta_stage1 --budget-s 95 --set cta.FEW_ROWS=0
TAILN=14 run after 125 python suites/bench_kernels.py --out $RES/after --kernels cta_stage0,cta_stage1 --budget-s 95
TAILN=8 run cta_ws2 140 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -s -p no:cacheprovider ../tests/gpu/test_gpu_cta.py -k "symm_numerics and ws2"
