# Call 1 on nvidia-h200-x4: the first symm runs at ws 4 -- GPU tests, then the collective suite (issue 3's bar) and the TP block.
TAILN=3 run info 20 bash -c 'nvidia-smi --query-gpu=name,driver_version --format=csv; nvidia-smi topo -m; python -c "import torch,triton; print(torch.__version__, triton.__version__, torch.cuda.nccl.version())"'
TAILN=30 run t4_gpu 200 env OVERLAP_TEST_TIMEOUT_S=120 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "ws4 and symm and not peer and not kernel"
TAILN=70 run bench_cg4 220 python -m torch.distributed.run --standalone --nproc-per-node=4 bench/bench_collective_gemm.py --suite ag_mm,mm_rs,mm_ar --lowerings symm --graphs --out-dir $RES
TAILN=20 run block4 110 python -m torch.distributed.run --standalone --nproc-per-node=4 bench/bench_block.py --out-dir $RES --variants inductor,async_tp,overlap_symm --rounds 3
