# For the next session that gets nvidia-h200-x4 (or -x2: the ws-4 parts then say "skipped"):
#   DEADLINE=545 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session19/commands/next_x4.sh
# Part A: do the seventeenth session's two switches pay on 4 GPUs? (both pass the GPU tests at 4 ranks sharing one GPU,
# session 18; RS_TMA is now on by default, so "one" below has it and "ptr" is the pointer-store-only A/B; at 2 GPUs,
# session 19, RS_TMA took mm_rs 16384x2048x8192 from 0.695 to 0.551 ms eager)
TR="python -m torch.distributed.run --standalone --nproc-per-node=4"
# First (any multi-GPU kind): the watchdog's message names stream-waited flags again (session 19's fix, CPU-tested).
TAILN=8 run t_timeout 45 python -m pytest -q -s -p no:cacheprovider tests/test_gpu.py::test_symm_timeout_names_op_rank_flag
# (the ws-4 GPU tests of both passed with 4 ranks sharing one GPU; on 4 GPUs, if time is left:)
# TAILN=12 run t_perpeer 150 python -m pytest -q -x tests/test_gpu.py -k "ws4 and (symm-perpeer or symm-rstma) and ops_numerics"
TAILN=30 run rs_one 90 $TR bench/bench_collective_gemm.py --suite mm_rs,mm_ar --lowerings symm --out-dir $RES/one
TAILN=30 run rs_perpeer 90 $TR bench/bench_collective_gemm.py --suite mm_rs,mm_ar --lowerings symm --out-dir $RES/perpeer --set runtime.symm.PUSH_STREAM_PER_PEER=True
TAILN=30 run rs_ptr 90 $TR bench/bench_collective_gemm.py --suite mm_rs --lowerings symm --out-dir $RES/ptr --set runtime.symm_lowering.RS_TMA=False
TAILN=30 run rs_peerstores 90 $TR bench/bench_collective_gemm.py --suite mm_rs,mm_ar --lowerings symm --out-dir $RES/peerstores --set "runtime.symm_lowering.TRANSPORT='peer'"
TAILN=20 run ag_perpeer 60 $TR bench/bench_collective_gemm.py --suite ag_mm --lowerings symm --out-dir $RES/perpeer --set runtime.symm.PUSH_STREAM_PER_PEER=True
# Part B (a second call): where the Llama step loses, traced; MoE at EP 4 with per-peer pushes.
# TAILN=8 run t_moe4 200 python -m pytest -q -x tests/test_gpu_moe.py -k "op_numerics and ws4 and symm-ce and not only"   (bf16 only at ws 4 now)
# TAILN=20 run llama4 300 $TR bench/bench_models.py --out $RES --sections llama --variants inductor,inductor_nocomm,overlap --mode reduce-overhead --trace $TRACES
# TAILN=30 run cmp 30 bash -c "python bench/trace_compare.py $TRACES/llama_cudagraphs_ws4_{inductor,inductor_nocomm,overlap}_rank0.json"
# TAILN=10 run moe4 150 $TR bench/bench_moe.py --out $RES/perpeer --configs deepseek --routing balanced --comm-sms '' --sweep '' --no-p2p --set runtime.symm.PUSH_STREAM_PER_PEER=True
# Part C: is the Llama step host-bound in default mode with every match rewritten (the cost model prices
# each symm op's host time as if the step were; 34 ops x ~0.45 ms)? Compare with the cost model on.
# TAILN=12 run llama4_off 240 env OVERLAP_COST_MODEL=off $TR bench/bench_models.py --out $RES/cost_model_off --sections llama --variants inductor,overlap
# Part D: the MoE symm op's slowdown after the p2p lowering ran (9.05 vs 6.34 ms at 2 GPUs; a traced single call
# is not slower, so back-to-back calls are). Hypothesis: host-bound calls (NCCL's proxy thread, busy after P2P,
# takes CPU from the op's enqueue). If replays (no host time) show no slowdown, the cause is on the host.
# TAILN=10 run moe_p2pfirst_graphs 150 $TR bench/bench_moe.py --out $RES/p2p_first_graphs --configs deepseek --routing balanced --comm-sms '' --sweep '' --p2p-first --graphs
# TAILN=10 run moe_clean_graphs 120 $TR bench/bench_moe.py --out $RES/clean_graphs --configs deepseek --routing balanced --comm-sms '' --sweep '' --no-p2p --graphs
# Part E (issue 8): the TP block training step with and without fused epilogues under CUDA graphs at ws 4, three
# times (the fifteenth session's one run: fused 5.244 vs unfused 5.328 ms, 144 vs 147 kernels per step).
# TAILN=12 run epi4_g1 100 $TR bench/bench_epilogue.py --out-dir $RES/epi1 --block tp --mode train --cudagraphs
# TAILN=12 run epi4_g2 100 $TR bench/bench_epilogue.py --out-dir $RES/epi2 --block tp --mode train --cudagraphs
# TAILN=12 run epi4_g3 100 $TR bench/bench_epilogue.py --out-dir $RES/epi3 --block tp --mode train --cudagraphs
# Part F (issue 4's "never slower"): every default config and routing at EP 4, symm only (no p2p in the process),
# with the new backend / base-backend columns (the cost model's decision and the measured time of that choice).
# TAILN=12 run moe4_all 200 $TR bench/bench_moe.py --out $RES/moe4_all --comm-sms '' --sweep '' --no-p2p
