export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=245
P="python -m pytest -q -s"
TAILN=6 run sh4_rstma 265 $P tests/test_gpu.py -k "ops_numerics and ws4 and symm-rstma"
TAILN=6 run sh4_perpeer 265 $P tests/test_gpu.py -k "ops_numerics and ws4 and symm-perpeer"
