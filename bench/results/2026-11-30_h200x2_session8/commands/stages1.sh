python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), torch.cuda.device_count())"
TAILN=14 run t_watch 170 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "dead_peer or timeout_names or fast_path" -s
TAILN=14 run t_captured 130 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "captured_symm" -s
TAILN=20 run t_ro_train 160 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "reduce_overhead" -s
TAILN=10 run t_moe_cap 100 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_moe.py -k "captured" -s
TAILN=10 run t_cta 100 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_cta.py -k "ws2" -s
