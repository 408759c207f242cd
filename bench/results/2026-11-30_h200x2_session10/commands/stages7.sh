TAILN=10 run t_cta 170 env OVERLAP_TEST_TIMEOUT_S=150 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_cta.py -k "ws2" -s
TAILN=20 run bench_cta 90 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_cta.py --sizes 512,1024,4096 --k-chunks 4,8 --transports ce --micro-batches 2,4 --out-dir $RES
TAILN=8 run probe_cta 80 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_cta.py --sizes 512,1024,4096 --op-variants notail,tail4096,tail12288,share4096,k8
