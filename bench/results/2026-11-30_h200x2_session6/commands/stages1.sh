python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), torch.cuda.device_count())"
TAILN=12 run t_watchdog 150 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "dead_peer or timeout_names" -s
TAILN=30 run bench_moe 200 env BENCH_STALL_DUMP_S=30 OVERLAP_TIMEOUT_S=30 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_moe.py --out $RES --configs deepseek,mixtral,deepseek-decode,mixtral-decode --routing balanced --comm-sms "" --sweep "ce-only" --no-p2p
TAILN=25 run epilogue 200 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_epilogue.py --out-dir $RES --block tp --mode train --trace $TRACES
