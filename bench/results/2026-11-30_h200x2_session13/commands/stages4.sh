# Thirteenth session, run 4: captured calls ship stage 0's tiles by the copy engine too (graph test with ce and
# peer); the whole GPU test file at 2 GPUs with this session's defaults; the bench with graphs; GPU-bound times.
TAILN=10 run t_cta 330 env OVERLAP_TEST_TIMEOUT_S=320 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_cta.py -k "ws2"
TAILN=24 run bench 150 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_cta.py --sizes 512,1024,4096 --acts gelu,swiglu --k-chunks 4 --transports ce --micro-batches 2,4 --graphs --out-dir $RES
TAILN=8 run probe 80 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_cta.py --sizes 512,1024,4096 --gpu-bound
