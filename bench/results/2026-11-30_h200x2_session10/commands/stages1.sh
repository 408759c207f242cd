python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), torch.cuda.device_count())"
TAILN=40 run t_cta 250 env OVERLAP_TEST_TIMEOUT_S=100 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_cta.py -k "ws2" -s
TAILN=8 run probe_cta 280 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_cta.py --sizes 512,1024,4096 --op-variants noshare,share2048,share4096,share8448
