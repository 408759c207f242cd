TAILN=8 run t_cta 190 env OVERLAP_TEST_TIMEOUT_S=180 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_cta.py -k "ws2"
TAILN=12 run probe 170 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_cta.py --sizes 512,1024,4096 --gpu-bound --op-variants tail8448,nogrouptail
TAILN=30 run bench 170 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_cta.py --sizes 512,1024,4096 --k-chunks 4 --transports ce --micro-batches 2 --swiglu-tails off,on --out-dir $RES
