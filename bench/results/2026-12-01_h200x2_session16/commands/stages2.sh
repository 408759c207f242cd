# Call 2, nvidia-h200-x2: what an activation epilogue costs a persistent Triton GEMM, by formulation (one GPU);
# the MoE symm op after p2p, traced (the slowdown's cause), and alone, traced.
TAILN=40 run probe_epi 200 env CUDA_VISIBLE_DEVICES=0 python bench/probe_ws.py --shapes 4096x8192x28672,1024x8192x28672,512x8192x28672 --configs 128x256x64x3x8 --epilogues none,gelu,gelu_hsig,gelu_fast,gelu_tanh_approx,gelu_erf,silu,silu_fast --no-ws --stage0
TAILN=6 run moe2_diag 100 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_moe.py --out $RES/p2p_first --configs deepseek --routing balanced --comm-sms '' --sweep '' --p2p-first --trace $TRACES
TAILN=6 run moe2_clean 70 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_moe.py --out $RES --configs deepseek --routing balanced --comm-sms '' --sweep '' --no-p2p --trace $TRACES/clean
