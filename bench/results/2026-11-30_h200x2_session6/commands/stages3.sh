TAILN=8 run t_fast 200 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "fast_path or (ws2 and symm and repeated) or (recompiles and symm)" -s
TAILN=14 run probe_host 90 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_host.py --out $RES/probe_host_ws2.json
TAILN=30 run epilogue 170 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_epilogue.py --out-dir $RES --block tp --mode train
TAILN=12 run bench_moe 120 env BENCH_STALL_DUMP_S=30 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_moe.py --out $RES --configs deepseek,mixtral,deepseek-decode,mixtral-decode --routing balanced --comm-sms "" --sweep "" --no-p2p
TAILN=8 run t_moe_layer 150 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_moe.py -k "ws2 and compiled_moe_layer" -s
