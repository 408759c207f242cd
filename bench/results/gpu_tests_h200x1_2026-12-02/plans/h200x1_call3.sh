# One H200, ranks sharing it: host time after the cuBLAS whole-chunk push, the fused MoE test, the kernel
# benchmark of record, a second run of the smoke set (run_stages runs in bench/).
TAILN=16 run bench_host 130 env OVERLAP_TIMEOUT_S=60 python -m torch.distributed.run --standalone --nproc-per-node=2 suites/bench_host.py --out $RES/host --sizes 512,8192 --profile
TAILN=12 run fused_moe 90 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -n 4 ../tests/gpu/test_gpu_moe.py -k "fused and ws2"
TAILN=30 run kernels 330 env PYTHONPATH=.. python suites/bench_kernels.py --out $RES/kernels --budget-s 270
TAILN=8 run smoke 120 env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu_smoke -n 3 ../tests/gpu
