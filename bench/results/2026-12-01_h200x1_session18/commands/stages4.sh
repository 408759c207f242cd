export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=140
P="python -m pytest -q -s"
TAILN=4 run sh2_rstma 110 $P tests/test_gpu.py -k "ops_numerics and ws2 and symm-rstma"
TAILN=6 run sh4_moe 150 $P tests/test_gpu_moe.py -k "op_numerics and ws4 and symm-ce and not only"
TAILN=6 run sh4_cta 130 $P tests/test_gpu_cta.py -k "symm_numerics and ws4"
TAILN=6 run sh4_epi 120 $P tests/test_gpu_epilogues.py -k "ws4 and ops_with and symm and not peer"
