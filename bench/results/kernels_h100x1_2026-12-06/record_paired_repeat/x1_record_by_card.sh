# One GPU, whichever card comes (run_stages runs in bench/): the GPU smoke set with every rank on the GPU (the ops
# tune their configs in two rounds), then on an H200 the kernel benchmark of record (each config call by call
# against cuBLAS; it replaces kernels_h200x1_2026-12-06/record, timed one config after the other), on an H100 the
# same record again, to set beside kernels_h100x1_2026-12-06/record_paired (how far two paired runs differ).
TAILN=8 run smoke 120 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu_smoke -n 3 ../tests/gpu
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  TAILN=12 run kernels_h200 440 python suites/bench_kernels.py --out $RES/kernels_h200 --budget-s 380
else
  TAILN=12 run kernels_repeat 440 python suites/bench_kernels.py --out $RES/kernels_repeat --budget-s 380
fi
