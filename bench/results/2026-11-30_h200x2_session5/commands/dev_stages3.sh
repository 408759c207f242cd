RES=$OUT/results; mkdir -p $RES
TAILN=20 run bench_moe 380 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_moe.py --out $RES --configs deepseek,mixtral --routing balanced,skewed --comm-sms "" --sweep schedule=phased --no-p2p
mkdir -p $RES/decode
TAILN=12 run bench_moe_decode 150 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_moe.py --out $RES/decode --configs deepseek-decode --routing balanced --comm-sms "" --sweep "" --no-p2p
