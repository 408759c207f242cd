# One H200, ranks sharing it: host time per call of the compiled collective-GEMM graphs (bench_host.py).
TAILN=3 run versions 60 python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
TAILN=40 run bench_host 480 env OVERLAP_TIMEOUT_S=60 python -m torch.distributed.run --standalone --nproc-per-node=2 suites/bench_host.py --out $RES/host --sizes ${HOST_SIZES:-512,8192} --profile
