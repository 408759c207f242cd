python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), torch.cuda.device_count())"
TAILN=30 run models_cg 260 env BENCH_STALL_DUMP_S=60 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_models.py --out $RES --sections serve --quick --mode reduce-overhead --variants eager,inductor,overlap --verbose
TAILN=20 run probe_graph 100 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_host.py --graph --out $RES/probe_host_graph_ws2.json
TAILN=12 run t_ops 150 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "ws2 and ops_numerics and symm and not peer" -s
