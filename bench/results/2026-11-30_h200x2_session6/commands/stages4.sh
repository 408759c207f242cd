TAILN=400 run probe_host 150 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_host.py --ab --profile --out $RES/probe_host_ws2.json
