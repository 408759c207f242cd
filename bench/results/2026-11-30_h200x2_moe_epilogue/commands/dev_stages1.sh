python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.device_count())"
run timeout_test 60 env OVERLAP_TIMEOUT_S=1 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k names_op_rank -s
run moe_sm8 150 env OVERLAP_TIMEOUT_S=20 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_moe.py -k "ws2 and symm-sm8" -s
run cta 130 env OVERLAP_TIMEOUT_S=20 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_cta.py -k ws2 -s
run symm_ops 90 env OVERLAP_TIMEOUT_S=20 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "ws2 and symm and not compiled and not names_op" -s
run epi 160 env OVERLAP_TIMEOUT_S=20 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_epilogues.py -k "ws2 and symm" -s
