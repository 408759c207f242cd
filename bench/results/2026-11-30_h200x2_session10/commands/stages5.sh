mkdir -p $RES/graphs
TAILN=14 run bench_cta_graphs 150 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_cta.py --sizes 512,1024,4096 --k-chunks 4,8 --transports ce --micro-batches 2,4 --graphs --out-dir $RES/graphs
TAILN=12 run t_rep_cap 130 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "(repeated_calls and symm and not peer) or captured_symm" -s
