TAILN=10 run probe 150 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_symm.py --ops mm_rs,mm_ar
TAILN=12 run t_ops 170 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "ops_numerics and symm and not peer" -s
TAILN=12 run t_rep_cap 110 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "(repeated_calls and symm and not peer) or captured_symm" -s
TAILN=30 run bench_cg 100 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_collective_gemm.py --suite mm_rs,mm_ar --lowerings symm --out-dir $RES
