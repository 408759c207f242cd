# One H200, ranks sharing it, after h200x1_call_a on the same warm machine: the host time of moe_experts and
# cta_pipeline_mlp (private graphs and the eager host path), then the smoke set warm until the deadline.
SMOKE="env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider -m gpu_smoke -n 3 ../tests/gpu"
TAILN=40 run bench_host_moe_cta 240 env OVERLAP_TIMEOUT_S=60 python -m torch.distributed.run --standalone --nproc-per-node=2 suites/bench_host.py --out $RES/host --ops moe,cta --sizes 512,8192 --profile --private-graphs
for i in $(seq 1 6); do TAILN=4 run smoke$i 110 $SMOKE; done
