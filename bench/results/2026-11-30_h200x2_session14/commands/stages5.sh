TAILN=60 run bench_cg 360 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_collective_gemm.py --suite ag_mm,mm_rs,mm_ar --lowerings symm --graphs --out-dir $RES
TAILN=6 run t_cap 130 env OVERLAP_TEST_TIMEOUT_S=120 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "captured_symm_ops_replay"
