# One H200, ranks sharing it: the GPU smoke set, the host-time benchmark, the fused gate/up MoE test.
TAILN=3 run versions 40 python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
TAILN=30 run smoke 330 env OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu_smoke -n 3 ../tests/gpu
TAILN=16 run bench_host 150 env OVERLAP_TIMEOUT_S=60 python -m torch.distributed.run --standalone --nproc-per-node=2 suites/bench_host.py --out $RES/host --sizes 512,8192 --profile
TAILN=4 run bench_host_ag_triton 60 env OVERLAP_TIMEOUT_S=60 python -m torch.distributed.run --standalone --nproc-per-node=2 suites/bench_host.py --out $RES/host_ag_triton --sizes 512 --ops ag_mm --set symm.AG_MM_GEMM=triton
TAILN=12 run fused_moe 200 env OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -n 4 ../tests/gpu/test_gpu_moe.py -k "fused and ws2"
