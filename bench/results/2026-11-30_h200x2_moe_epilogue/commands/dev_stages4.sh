RES=$OUT/results; mkdir -p $RES
run cta_graphs 75 env OVERLAP_TIMEOUT_S=20 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_cta.py -k "ws2 and graphs" -s
run moe_ce 80 env OVERLAP_TIMEOUT_S=20 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_moe.py -k "ws2 and symm-ce" -s
TAILN=40 run bench_moe 200 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_moe.py --out $RES --configs deepseek,mixtral,deepseek-decode,mixtral-decode --routing balanced,skewed --comm-sms 8
