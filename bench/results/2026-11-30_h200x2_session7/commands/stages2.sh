python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), torch.cuda.device_count())"
TAILN=8 run t_dead 90 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "dead_peer" -s
TAILN=12 run t_ro 150 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "ws2 and reduce_overhead" -s
TAILN=25 run models_cg 220 env BENCH_STALL_DUMP_S=60 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_models.py --out $RES --sections serve --quick --mode reduce-overhead --variants eager,inductor,overlap
TAILN=14 run models 150 env BENCH_STALL_DUMP_S=60 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_models.py --out $RES --sections serve --quick --variants eager,inductor,overlap
