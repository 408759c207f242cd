TAILN=60 run t_reduce_overhead 290 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "ws2 and reduce_overhead" -s
