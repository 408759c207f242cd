TAILN=6 run t_epi 140 env OVERLAP_TEST_TIMEOUT_S=130 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_epilogues.py -k "ws2 and numerics and symm and not peer"
TAILN=6 run t_epi_c 120 env OVERLAP_TEST_TIMEOUT_S=110 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_epilogues.py -k "ws2 and compiled and symm and not peer"
TAILN=10 run epi_train_g 110 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_epilogue.py --out-dir $RES --block tp --mode train --cudagraphs
TAILN=10 run epi_inf_g 60 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_epilogue.py --out-dir $RES --block tp --mode inference --cudagraphs
TAILN=20 run models_g 150 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_models.py --out $RES --mode reduce-overhead --sections llama --variants inductor,overlap
