TAILN=6 run t_rs 170 env OVERLAP_TEST_TIMEOUT_S=160 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "ws2 and (ops_numerics or repeated_calls) and symm and not peer and not kernel"
TAILN=4 run t_cap 60 env OVERLAP_TEST_TIMEOUT_S=50 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "captured_symm_ops_replay"
TAILN=4 run t_epi 110 env OVERLAP_TEST_TIMEOUT_S=100 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_epilogues.py -k "ws2 and numerics and symm and not peer"
mkdir -p $RES/own_after_wait $RES/own_first
TAILN=14 run bench_old 60 env RS_OWN_FIRST=0 python -m torch.distributed.run --standalone --nproc-per-node=2 devrun/bench_rs_ab.py --suite mm_rs,mm_ar --lowerings symm --graphs --out-dir $RES/own_after_wait
TAILN=14 run bench_new 60 env RS_OWN_FIRST=1 python -m torch.distributed.run --standalone --nproc-per-node=2 devrun/bench_rs_ab.py --suite mm_rs,mm_ar --lowerings symm --graphs --out-dir $RES/own_first
