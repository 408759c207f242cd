RES=$OUT/results; mkdir -p $RES
TAILN=20 run bench_moe 200 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_moe.py --out $RES --configs deepseek,mixtral --routing balanced,skewed --comm-sms "" --sweep "schedule=rotated,ce-only,ce-only+schedule=rotated" --no-p2p
mkdir -p $RES/decode
TAILN=12 run bench_moe_decode 100 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_moe.py --out $RES/decode --configs deepseek-decode,mixtral-decode --routing balanced --comm-sms "" --sweep "ce-only,order=source" --no-p2p
run t_moe 120 env OVERLAP_TIMEOUT_S=20 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_moe.py -k "ws2 and symm-ce-only" -s
