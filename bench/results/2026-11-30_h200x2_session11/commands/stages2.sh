TAILN=4 run t_fast 60 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "fast_triton_launch or stream_operations_fast"
TAILN=20 run probe_host 150 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_cta.py --sizes 512,1024,4096 --host-breakdown
TAILN=12 run bench_cta 100 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_cta.py --sizes 512,1024,4096 --acts gelu,swiglu --k-chunks 4 --transports ce --micro-batches 2 --trace $TRACES --trace-m 512 --out-dir $RES
TAILN=8 run t_cta 170 env OVERLAP_TEST_TIMEOUT_S=150 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_cta.py -k "ws2"
