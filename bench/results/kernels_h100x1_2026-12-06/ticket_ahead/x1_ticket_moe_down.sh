# One GPU: mm_rs / mm_ar drawing the next tile ticket before the current tile's work (knobs.codegen.RS_TICKET_AHEAD,
# the default) against after it, the op candidates at every shape, in one call; moe_experts' down kernel with its
# flattened tile loop as variants; the GPU tests of both first, the smoke set last (run_stages runs in bench/).
TAILN=12 run tests 150 env PYTHONPATH=.. python -m pytest -q -rA -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k "two_ctas or moe_down" -s
TAILN=4 run ahead 100 python suites/bench_kernels.py --out $RES/ahead --kernels mm_rs,mm_ar --no-variants --budget-s 80
TAILN=4 run after 100 python suites/bench_kernels.py --out $RES/after --kernels mm_rs,mm_ar --no-variants --budget-s 80 --set codegen.RS_TICKET_AHEAD=False
TAILN=16 run moe_down 120 python suites/bench_kernels.py --out $RES/moe_down --kernels moe_down --budget-s 100
TAILN=8 run smoke 110 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu_smoke -n 3 ../tests/gpu
