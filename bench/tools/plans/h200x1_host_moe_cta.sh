# One H200, ranks sharing it: host time per call of the moe_experts and cta_pipeline_mlp graphs (bench_host.py
# --ops moe,cta), beside the eager host path, with the ops' private CUDA graphs (run_stages runs in bench/).
TAILN=40 run bench_host_moe_cta 420 env OVERLAP_TIMEOUT_S=60 python -m torch.distributed.run --standalone --nproc-per-node=2 suites/bench_host.py --out $RES/host --ops moe,cta --sizes 512,8192 --profile --private-graphs
