# One H200 (or H100): the CTA op's GPU tests at 4 ranks sharing the GPU (2 stages x TP2), with split-K at decode
# sizes: numerics with every knob setting and the in-place weight update, then CUDA graphs (run_stages runs in
# bench/; each took over 130 s on an H100, more when its kernels compile cold).
P="env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider"
TAILN=8 run cta_ws4 300 $P ../tests/gpu/test_gpu_cta.py -k "symm_numerics and ws4"
TAILN=8 run cta_graphs_ws4 250 $P ../tests/gpu/test_gpu_cta.py -k "cuda_graphs and ws4"
