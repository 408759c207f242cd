TAILN=8 run probe_rs 200 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_symm.py --ops mm_rs
TAILN=14 run t_watch 170 env OVERLAP_TEST_TIMEOUT_S=150 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py tests/test_gpu_moe.py -k "dead_peer or timeout_names" -s
