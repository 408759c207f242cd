TAILN=80 run probe_host 150 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_host.py --profile --out $RES/probe_host_ws2.json
TAILN=30 run bench_moe 130 env BENCH_STALL_DUMP_S=30 OVERLAP_TIMEOUT_S=30 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_moe.py --out $RES --configs deepseek-decode,mixtral-decode --routing balanced,skewed --comm-sms "" --sweep "ce-only" --no-p2p
TAILN=16 run epilogue 150 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_epilogue.py --out-dir $RES --block tp --mode train
TAILN=10 run t_repeat 120 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "ws2 and symm and (repeated or two_groups)" -s
