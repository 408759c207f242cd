TAILN=12 run t_watch 170 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py tests/test_gpu_moe.py -k "dead_peer or timeout_names" -s
TAILN=30 run probe_cta 220 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_cta.py --sizes 1024,4096 --stage0-variants stages4,flatten,flatten+stages4,bn128,group8
