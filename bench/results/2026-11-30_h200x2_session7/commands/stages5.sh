python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), torch.cuda.device_count())"
TAILN=40 run bench_moe 230 env BENCH_STALL_DUMP_S=60 OVERLAP_TIMEOUT_S=30 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_moe.py --out $RES --configs deepseek-decode,mixtral-decode,deepseek,mixtral --routing balanced --comm-sms "" --sweep "" --no-p2p --graphs
TAILN=20 run t_ro_ws2 80 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "ws2 and reduce_overhead and capture_symm" -s
