python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), torch.cuda.device_count())"
TAILN=12 run t_moe_cap 200 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_moe.py -k "captured" -s
TAILN=8 run t_moe_ops 200 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_moe.py -k "ws2 and ((symm-ce and not only) or capacity)" -s
TAILN=6 run t_captured 90 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "captured_symm" -s
