TAILN=60 run diag 60 python -m torch.distributed.run --standalone --nproc-per-node=2 devrun/diag.py
