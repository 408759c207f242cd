nvidia-smi --query-gpu=name,compute_mode --format=csv > $RES/compute_mode.txt 2>&1; cat $RES/compute_mode.txt
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30
P="python -m pytest -q -x -s tests/test_gpu.py"
TAILN=8 run sh2_symm 120 $P -k "ws2 and ops_numerics and symm and not symm-"
TAILN=8 run sh2_rstma 100 $P -k "ws2 and ops_numerics and symm-rstma"
TAILN=8 run sh4_perpeer_rep 100 $P -k "ws4 and repeated_calls and symm-perpeer"
TAILN=8 run sh4_rstma 100 $P -k "ws4 and ops_numerics and symm-rstma"
TAILN=8 run sh4_perpeer 100 $P -k "ws4 and ops_numerics and symm-perpeer"
TAILN=8 run sh4_rstma_rep 80 $P -k "ws4 and repeated_calls and symm-rstma"
