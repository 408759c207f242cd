# For the next session (two GPUs, or one with OVERLAP_TEST_SHARED_GPU=1): where calibrate --host's probes fault.
#   DEADLINE=400 bash bench/run_stages.sh bench/results/2026-12-01_h200x2_session20/commands/next_host_probe.sh
export OVERLAP_TIMEOUT_S=30
TAILN=8 run t_host 150 python -m pytest -q -s -p no:cacheprovider tests/test_gpu.py::test_calibrate_measures_symm_host_time
TAILN=10 run probes_seq 120 python bench/results/2026-12-01_h200x2_session20/commands/host_probe_debug.py sequence
TAILN=10 run probes_alone 200 python bench/results/2026-12-01_h200x2_session20/commands/host_probe_debug.py alone
