TAILN=20 run probe_moe_graph2 150 python -m torch.distributed.run --standalone --nproc-per-node=2 devrun/probe_moe_graph2.py
