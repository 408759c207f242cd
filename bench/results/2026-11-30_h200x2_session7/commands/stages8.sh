TAILN=14 run bench_moe 110 env OVERLAP_TIMEOUT_S=30 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_moe.py --out $RES --configs deepseek-decode,mixtral-decode,deepseek,mixtral --routing balanced --comm-sms "" --sweep "" --no-p2p --graphs
TAILN=6 run t_moe_cap 70 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_moe.py -k "captured and ce" -s
