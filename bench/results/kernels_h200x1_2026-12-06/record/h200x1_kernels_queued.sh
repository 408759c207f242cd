# One H200, a fresh machine: the timing test, then the kernel benchmark of record, every kernel, with
# GPU times of queued calls (the host's launch time left out, recorded beside them) and the back-to-back reading
# of each case's op config and baseline, and the collective GEMMs' cuBLAS paths (run_stages runs in bench/).
P="env PYTHONPATH=.. python -m pytest -q -rA -s -p no:cacheprovider"
TAILN=4 run timing 60 $P ../tests/gpu/test_gpu_timing.py
TAILN=12 run kernels 520 python suites/bench_kernels.py --out $RES/kernels --budget-s 400
# Ran on an H100 (bench/results/kernels_h100x1_2026-12-05/queued); still to run on an H200, whose entries in
# kernel_ratios.json are from calls timed back to back (kernels_h200x1_2026-12-02). Afterwards:
# python bench/tools/install_ratios.py bench/results/kernels_h200x1_<date>  (paths.md: the op's path at each shape)
