# One H200, ranks sharing it, a fresh machine: the smoke set cold (its own bar: <= 5 min including Triton's
# compilation; also the first GPU run of the grad-mode check of the ops and the ranks' configuration check,
# which its compiled CTA test goes through), the CTA stages on cuBLAS at ws 2 and 4, then the smoke set warm
# until the deadline (run_stages runs in bench/).
SMOKE="env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu_smoke -n 3 ../tests/gpu"
TAILN=12 run smoke_cold 330 $SMOKE
TAILN=30 run cta_cublas 150 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider ../tests/gpu/test_gpu_cta_cublas.py
for i in $(seq 1 4); do TAILN=4 run smoke$i 110 $SMOKE; done
