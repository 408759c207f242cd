TAILN=14 run t_watch 150 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py tests/test_gpu_moe.py -k "dead_peer or timeout_names" -s
TAILN=6 run t_captured 60 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "captured_symm" -s
TAILN=12 run t_cta 200 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_cta.py -k "ws2" -s
TAILN=30 run bench_cta 200 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_cta.py --sizes 512,1024,4096 --k-chunks 4,8 --transports ce --micro-batches 2,4 --out-dir $RES
