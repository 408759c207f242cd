# One H200, ranks sharing it, after h200x1_forms.sh on the same warm machine: the smoke set in a loop until the
# deadline (the 20-run loop; run_stages runs in bench/).
SMOKE="env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu_smoke -n 3 ../tests/gpu"
for i in $(seq 1 8); do TAILN=4 run smoke$i 100 $SMOKE; done
