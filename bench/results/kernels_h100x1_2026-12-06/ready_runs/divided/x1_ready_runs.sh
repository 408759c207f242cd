# One GPU (run_stages runs in bench/): CTA stage 1 reading each run of chunks already here in one pipelined K-loop
# (knobs.cta.STAGE1_READY_RUNS, as set) against a K-loop per chunk (--set cta.STAGE1_READY_RUNS=False), in both
# orders (python bench/tools/kernel_ab.py A B); then, on an H200, the kernel benchmark of record; on another card,
# the CTA op at 4 ranks sharing the GPU (two producers' chunks interleaved, real waits), then the ops at 2 and 4
# ranks with ag_mm on its cuBLAS path (short chunks merged, knobs.symm.AG_CUBLAS_MERGE_ROWS).
TAILN=4 run stage1_runs 60 python suites/bench_kernels.py --out $RES/stage1_runs --kernels cta_stage1 --budget-s 45 --no-variants
TAILN=4 run stage1_chunks 60 python suites/bench_kernels.py --out $RES/stage1_chunks --kernels cta_stage1 --budget-s 45 --no-variants --set cta.STAGE1_READY_RUNS=False
TAILN=4 run stage1_chunks_b 60 python suites/bench_kernels.py --out $RES/stage1_chunks_b --kernels cta_stage1 --budget-s 45 --no-variants --set cta.STAGE1_READY_RUNS=False
TAILN=4 run stage1_runs_b 60 python suites/bench_kernels.py --out $RES/stage1_runs_b --kernels cta_stage1 --budget-s 45 --no-variants
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  TAILN=12 run kernels 310 python suites/bench_kernels.py --out $RES/kernels --budget-s 270
else
  TAILN=8 run cta_ws4 200 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -s -p no:cacheprovider ../tests/gpu/test_gpu_cta.py -k "symm_numerics and ws4"
  TAILN=10 run agcublas 300 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -s -p no:cacheprovider ../tests/gpu/test_gpu.py -k "symm-agcublas and (ws2 or ws4) and (numerics or repeated)"
fi
