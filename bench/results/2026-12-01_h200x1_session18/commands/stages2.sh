export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30
P="python -m pytest -q -s"
TAILN=6 run sh4_num 190 $P tests/test_gpu.py -k "ops_numerics and ws4 and (symm-rstma or symm-perpeer)"
TAILN=6 run sh2_num 90 $P tests/test_gpu.py -k "ops_numerics and ws2 and symm-rstma"
TAILN=6 run sh8_rep 90 $P tests/test_gpu.py -k "repeated_calls and ws8 and symm-rstma"
TAILN=6 run sh_capt 70 $P tests/test_gpu.py -k "captured_symm_ops_replay or (two_groups and ws4 and symm)"
TAILN=6 run sh4_moe 90 $P tests/test_gpu_moe.py -k "op_numerics and ws4 and symm-sm8"
