TAILN=40 run probe_moe_graph 120 python -m torch.distributed.run --standalone --nproc-per-node=2 devrun/probe_moe_graph.py $TRACES
