TAILN=8 run t_ops 150 env OVERLAP_TEST_TIMEOUT_S=140 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "ws2 and repeated_calls and symm and not peer" -s
TAILN=6 run t_moe 130 env OVERLAP_TEST_TIMEOUT_S=125 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_moe.py -k "ws2 and numerics_repeated and symm-ce and not only"
TAILN=6 run t_cta 140 env OVERLAP_TEST_TIMEOUT_S=130 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_cta.py -k "ws2 and not compiled"
TAILN=6 run t_epi 140 env OVERLAP_TEST_TIMEOUT_S=130 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_epilogues.py -k "ws2 and numerics and symm and not peer"
