TAILN=150 run t_cta_all 250 env OVERLAP_TEST_TIMEOUT_S=100 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_cta.py -k "ws2" -s
