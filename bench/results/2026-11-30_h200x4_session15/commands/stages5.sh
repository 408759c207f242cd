# Call 5, on nvidia-h200-x2 (the 4-GPU kind was no longer lent): the fourteenth session's mm_rs band rule
# (RS_OWN_FIRST) GPU-tested; does timing p2p before symm slow the MoE symm op (EP 4: 10.07 ms after p2p in
# call 3, 6.12 alone in call 4)? the Llama step under graphs with async-TP, after "reset the CUDA-graph trees
# between variants" in bench_models.
TAILN=6 run t_rs 170 env OVERLAP_TEST_TIMEOUT_S=160 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "(ws2 and (ops_numerics or repeated_calls) and symm and not peer and not kernel) or captured_symm_ops_replay"
TAILN=6 run moe2_symm 60 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_moe.py --out $RES --configs deepseek,mixtral --routing balanced --comm-sms '' --sweep '' --no-p2p
TAILN=4 run moe2_p2p 60 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_moe.py --out $RES/with_p2p --configs deepseek,mixtral --routing balanced --comm-sms '' --sweep ''
TAILN=20 run models2_g 150 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_models.py --out $RES --mode reduce-overhead --sections llama --variants inductor,async_tp,overlap
