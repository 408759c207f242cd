# Call 3 on nvidia-h200-x4: issue 4's bar (MoE at EP 4), issue 8's (fused epilogues at ws 4), the MoE / CTA / epilogue GPU tests at ws 4.
TAILN=40 run moe4 200 python -m torch.distributed.run --standalone --nproc-per-node=4 bench/bench_moe.py --out $RES --configs deepseek,mixtral,deepseek-decode --routing balanced,skewed --comm-sms 8 --sweep ''
TAILN=15 run epi4 120 python -m torch.distributed.run --standalone --nproc-per-node=4 bench/bench_epilogue.py --out-dir $RES --block tp --mode train
TAILN=15 run t4_more 180 env OVERLAP_TEST_TIMEOUT_S=120 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_cta.py tests/test_gpu_moe.py tests/test_gpu_epilogues.py -k "ws4 and (cta or symm-sm8 or (numerics and symm and not peer))"
