# One GPU, a fresh machine: the timing's own GPU test, then on an H200 the kernel benchmark of record, every kernel
# with every variant, the cuBLAS paths and forms and the fused ag_mm rows' epilogue-apart path (GPU times of
# queued calls, each config call by call against cuBLAS); on another card (whose record is current) the ag_mm
# rows only, for their epilogue-apart path. run_stages runs in bench/. Afterwards:
# python bench/tools/install_ratios.py DIR, python bench/tools/variant_holdout.py DIR --ratios BEFORE (the
# variants the installed file had adopted, timed again) and python bench/suites/kernel_paths.py DIR.
TAILN=8 run timing_test 60 env PYTHONPATH=.. python -m pytest -q -rA -s -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_timing.py
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  TAILN=12 run kernels 500 python suites/bench_kernels.py --out $RES/kernels --budget-s 420
else
  TAILN=12 run kernels 300 python suites/bench_kernels.py --out $RES/kernels --kernels ag_mm --budget-s 240
fi
