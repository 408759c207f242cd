TAILN=4 run probe_host 120 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_cta.py --sizes 512,1024 --profile
TAILN=12 run bench_trace 100 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_cta.py --sizes 512,1024,4096 --acts gelu --k-chunks 4 --transports ce --micro-batches 2 --trace $TRACES --trace-m 512,1024,4096 --out-dir $RES
TAILN=8 run t_ops 150 env OVERLAP_TEST_TIMEOUT_S=120 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "ops_numerics and symm and not peer"
TAILN=8 run t_cta 170 env OVERLAP_TEST_TIMEOUT_S=150 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_cta.py -k "ws2"
