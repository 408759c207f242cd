TAILN=8 run probe 330 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_cta.py --sizes 1024,512,4096 --gpu-bound --op-variants s0occ2
