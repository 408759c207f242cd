# One GPU (run_stages runs in bench/): CTA stage 1's runs of ready chunks with the K-loop carrying its (chunk, k)
# instead of dividing the step count (knobs.cta.STAGE1_READY_RUNS, as set) against a K-loop per chunk (--set
# cta.STAGE1_READY_RUNS=False), in both orders (python bench/tools/kernel_ab.py A B); then the CTA op at 2 ranks
# sharing the GPU.
TAILN=4 run stage1_runs 60 python suites/bench_kernels.py --out $RES/stage1_runs --kernels cta_stage1 --budget-s 45 --no-variants
TAILN=4 run stage1_chunks 60 python suites/bench_kernels.py --out $RES/stage1_chunks --kernels cta_stage1 --budget-s 45 --no-variants --set cta.STAGE1_READY_RUNS=False
TAILN=4 run stage1_chunks_b 60 python suites/bench_kernels.py --out $RES/stage1_chunks_b --kernels cta_stage1 --budget-s 45 --no-variants --set cta.STAGE1_READY_RUNS=False
TAILN=4 run stage1_runs_b 60 python suites/bench_kernels.py --out $RES/stage1_runs_b --kernels cta_stage1 --budget-s 45 --no-variants
TAILN=8 run cta_ws2 200 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -s -p no:cacheprovider ../tests/gpu/test_gpu_cta.py -k "symm_numerics and ws2"
