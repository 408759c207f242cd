RES=$OUT/results; mkdir -p $RES
TAILN=60 run probe_moe_gemm 170 python bench/probe_moe_gemm.py --ws 2 --configs mixtral,deepseek,deepseek-decode --out $RES/probe_moe_gemm_ws2.json
TAILN=60 run epilogue_train 230 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_epilogue.py --out-dir $RES --block tp --mode train
run tests_ro 150 env OVERLAP_TIMEOUT_S=20 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py tests/test_gpu_moe.py -k "(ws2 and reduce_overhead) or recompiles or (ws2 and symm-ce-only) or (ws2 and loop)" -s
