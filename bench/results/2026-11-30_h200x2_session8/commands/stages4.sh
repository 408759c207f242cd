TAILN=8 run t_moe_late 100 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_moe.py -k "timeout_names" -s
TAILN=30 run probe_cta 260 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_cta.py --sizes 512,1024,4096 --stage0-variants group8,swz2,swz4,swz2+first --op-variants first,swz2,swz2+first,swz4+first,swz2+first+k8
