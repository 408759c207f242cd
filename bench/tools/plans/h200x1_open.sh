# One H200, ranks sharing it: what is still to run on one GPU. The CTA stages on cuBLAS at ws 2 and 4, the host
# time of moe_experts and cta_pipeline_mlp, then the smoke set in a loop (20 runs take about three such calls;
# run_stages runs in bench/).
T="env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider"
TAILN=30 run cta_cublas 150 $T ../tests/gpu/test_gpu_cta_cublas.py
TAILN=40 run bench_host_moe_cta 240 env OVERLAP_TIMEOUT_S=60 python -m torch.distributed.run --standalone --nproc-per-node=2 suites/bench_host.py --out $RES/host --ops moe,cta --sizes 512,8192 --profile --private-graphs
for i in $(seq 1 9); do TAILN=3 run smoke$i 110 $T -m gpu_smoke -n 3 ../tests/gpu; done
