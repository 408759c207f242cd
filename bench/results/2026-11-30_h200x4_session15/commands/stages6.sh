# Call 6 on nvidia-h200-x2: the Llama step under graphs after "a CPU node does not stop the capture under graph
# partitions" (the forward graph's ops priced as captured: no host floor).
TAILN=16 run models2_g 160 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_models.py --out $RES --mode reduce-overhead --sections llama --variants inductor,overlap
