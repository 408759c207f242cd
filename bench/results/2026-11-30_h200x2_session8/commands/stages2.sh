TAILN=40 run t_late 100 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "timeout_names" -s
TAILN=60 run t_dead 100 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "dead_peer_unblocks" -s
TAILN=60 run t_dead_replay 100 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "dead_peer_in_a_replay" -s
TAILN=30 run probe_cta 150 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_cta.py --sizes 512,1024,4096
