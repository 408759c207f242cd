TAILN=6 run probe_rs 150 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_symm.py --ops mm_rs
