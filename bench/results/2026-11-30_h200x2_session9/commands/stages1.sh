python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), torch.cuda.device_count())"
TAILN=8 run probe_rs 150 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_symm.py --ops mm_rs
TAILN=40 run t_ops 200 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "ops_numerics and not p2p" -s
TAILN=14 run t_rep_cap 120 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "(repeated_calls and not p2p) or captured_symm" -s
TAILN=16 run bench_rs 120 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_collective_gemm.py --suite mm_rs --lowerings symm --out-dir $RES
