TAILN=4 run t_fast 60 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "fast_triton_launch or stream_operations_fast"
TAILN=14 run probe_host 120 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_cta.py --sizes 512,1024 --host-breakdown
TAILN=12 run bench_cta 90 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_cta.py --sizes 512,1024 --acts gelu,swiglu --k-chunks 4 --transports ce --micro-batches 2 --out-dir $RES
