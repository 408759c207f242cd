TAILN=40 run t_moe 182 env OVERLAP_TEST_TIMEOUT_S=168 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_moe.py -k "ws2 and numerics_repeated and symm-ce and not only" -s
