# One GPU: mm_rs / mm_ar with the peers' partials loaded two at a time in the own tiles (knobs.codegen.RS_PARTIAL_STAGES
# 3, the default) against one at a time (1), at 4 and 8 GPUs' shapes, in one call; then the GPU smoke set if time is
# left (run_stages runs in bench/).
TAILN=30 run partials3 95 python suites/bench_kernels.py --out $RES/partials3 --kernels mm_rs,mm_ar --ws 4,8 --no-variants --budget-s 70
TAILN=30 run partials1 95 python suites/bench_kernels.py --out $RES/partials1 --kernels mm_rs,mm_ar --ws 4,8 --no-variants --budget-s 70 --set codegen.RS_PARTIAL_STAGES=1
TAILN=12 run smoke 120 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu_smoke -n 3 ../tests/gpu
