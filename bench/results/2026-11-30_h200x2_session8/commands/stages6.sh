TAILN=120 run t_cta_compiled 200 env OVERLAP_TEST_TIMEOUT_S=150 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_cta.py -k "ws2 and compiled" -s
