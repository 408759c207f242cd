RES=$OUT/results; mkdir -p $RES
run cta_graphs 75 env OVERLAP_TIMEOUT_S=20 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_cta.py -k "ws2 and graphs" -s
TAILN=40 run bench_moe 230 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_moe.py --out $RES --configs deepseek,mixtral,deepseek-decode --routing balanced,skewed --comm-sms 4,16 --no-p2p
TAILN=30 run bench_epi 170 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_epilogue.py --out-dir $RES --block tp --mode train
