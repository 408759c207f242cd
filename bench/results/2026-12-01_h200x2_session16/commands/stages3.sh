# Call 3, nvidia-h200-x2: the Llama step with free communication (the bound of any overlap), default and graphs.
TAILN=22 run models2_bound 150 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_models.py --out $RES --sections llama --variants inductor,inductor_nocomm,async_tp,overlap
TAILN=22 run models2_bound_g 150 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_models.py --out $RES --mode reduce-overhead --sections llama --variants inductor,inductor_nocomm,overlap
