# Session 20, call 8, nvidia-h200 (one GPU), two ranks on it:
#   DEADLINE=120 bash bench/run_stages.sh bench/results/2026-12-01_h200x2_session20/commands/stages8_x1.sh
# calibrate.measure_host on the symm lowering: host ms per call of ag_mm, mm_rs, mm_ar (one-shot, rounds) at the
# decode sizes of calibrate.HOST_PROBES (host time only: the ranks sharing the GPU do not change it much).
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=110
TAILN=6 run sh_host 110 python -m pytest -q -s -p no:cacheprovider tests/test_gpu.py::test_calibrate_measures_symm_host_time
