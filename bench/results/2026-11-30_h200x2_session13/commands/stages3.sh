# Thirteenth session, run 3: stage 0's last round of tail tiles in half-width tiles (STAGE0_SPLIT_LAST, off by
# default): GPU numerics with it on; GPU-bound times with it, and with smaller tails.
TAILN=8 run t_cta 220 env OVERLAP_TEST_TIMEOUT_S=210 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_cta.py -k "ws2 and numerics"
TAILN=12 run probe 200 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_cta.py --sizes 512,1024,4096 --gpu-bound --op-variants split,tail4096,split+tail4096,split+tail8192 --gpu-bound-trace $TRACES --trace-variant split
