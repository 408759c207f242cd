RES=$OUT/results; mkdir -p $RES
run t_moe 130 env OVERLAP_TIMEOUT_S=20 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_moe.py -k "ws2 and symm-ce and not only" -s
TAILN=14 run probe_moe_gemm 60 python bench/probe_moe_gemm.py --ws 2 --configs deepseek-decode,mixtral-decode,mixtral --out $RES/probe_moe_gemm_ws2.json
TAILN=30 run bench_moe 300 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_moe.py --out $RES --configs deepseek,mixtral,deepseek-decode,mixtral-decode --routing balanced,skewed --comm-sms "" --sweep "schedule=rotated,ce-only,ce-only+schedule=rotated" --no-p2p
