python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), torch.cuda.device_count())"
TAILN=14 run t_watch 150 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "dead_peer or timeout_names or fast_path" -s
TAILN=20 run t_captured 130 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "captured_symm" -s
TAILN=30 run probe_graph 100 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_host.py --graph --out $RES/probe_host_graph_ws2.json
TAILN=20 run t_ro 160 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "ws2 and reduce_overhead" -s
TAILN=10 run t_ops 120 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "ws2 and ops_numerics and symm" -s
