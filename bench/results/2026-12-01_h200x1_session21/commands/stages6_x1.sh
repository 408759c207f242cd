# Session 21, call 6, nvidia-h200 (one GPU), every rank on it:
#   DEADLINE=400 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session21/commands/stages6_x1.sh
# The fix: ranks sharing a GPU leave symm.SHARED_DEVICE_FREE_SMS SMs free (their copies run on SMs). The regression
# test (mm_ar rounds, BN=256 forced: hung every time in call 4), calibrate --host's test (crashed in session 20 and
# call 1), and the CTA numerics on the smaller grid.
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=180
P="python -m pytest -q -s -p no:cacheprovider"
TAILN=6 run sh_wide 110 $P tests/test_gpu.py::test_mm_ar_rounds_with_sm_filling_tiles
TAILN=8 run sh_host 180 $P tests/test_gpu.py::test_calibrate_measures_symm_host_time
TAILN=8 run sh_cta 120 $P "tests/test_gpu_cta.py::test_cta_pipeline_symm_numerics[ws2]"
