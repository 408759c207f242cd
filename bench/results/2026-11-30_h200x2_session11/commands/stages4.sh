TAILN=10 run probe_gpu_bound 150 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_cta.py --sizes 512,1024,4096 --gpu-bound --op-variants notail,tail4096,tail12288,share4096
TAILN=12 run probe_host_ab 70 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_host.py --launch-ab --out $RES/probe_host_ws2.json
TAILN=6 run t_moe 90 env OVERLAP_TEST_TIMEOUT_S=80 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_moe.py -k "ws2 and numerics_repeated and symm-ce and not only"
TAILN=6 run t_epi 90 env OVERLAP_TEST_TIMEOUT_S=80 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_epilogues.py -k "ws2 and numerics and symm and not peer"
