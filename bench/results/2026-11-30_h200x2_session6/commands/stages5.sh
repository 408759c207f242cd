TAILN=14 run epilogue_inf 110 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_epilogue.py --out-dir $RES --block tp --mode inference
TAILN=10 run t_reduce_overhead 190 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "ws2 and reduce_overhead" -s
TAILN=40 run models 290 env BENCH_STALL_DUMP_S=60 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_models.py --out $RES --sections llama,serve --quick
