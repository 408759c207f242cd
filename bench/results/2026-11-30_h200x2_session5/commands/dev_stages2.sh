RES=$OUT/results; mkdir -p $RES
run t_ops 110 env OVERLAP_TIMEOUT_S=20 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "ws2 and test_ops_numerics and symm" -s
run t_moe 110 env OVERLAP_TIMEOUT_S=20 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_moe.py -k "ws2 and symm-ce and not only" -s
TAILN=40 run bench_moe 190 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_moe.py --out $RES --configs deepseek,mixtral,deepseek-decode --routing balanced,skewed --comm-sms "" --sweep ce-only,schedule=phased --no-p2p
TAILN=25 run epilogue_train 110 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_epilogue.py --out-dir $RES --block tp --mode train
TAILN=30 run probe_moe_gemm 60 python bench/probe_moe_gemm.py --ws 2 --configs mixtral,deepseek,deepseek-decode --out $RES/probe_moe_gemm_ws2.json
