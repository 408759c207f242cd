# The next GPU calls, for what this session could not run at 4 GPUs (the x4 kind was withdrawn after call 4).
# Ask `status` first; with nvidia-h200-x4 lent, three calls (keep the machine warm: issue each within 30 s of the last):
#   mkdir devrun; cp bench/results/2026-11-30_h200x2_session6/commands/dev_run.sh devrun/
#   DEADLINE=560 bash devrun/dev_run.sh bench/results/2026-11-30_h200x4_session15/commands/next.sh        # call A
#   PART=B DEADLINE=560 bash devrun/dev_run.sh bench/results/2026-11-30_h200x4_session15/commands/next.sh # call B
#   PART=C DEADLINE=560 bash devrun/dev_run.sh bench/results/2026-11-30_h200x4_session15/commands/next.sh # call C
# Call A: issue 4 at EP 4 (the MoE numerics test needs > 120 s to compile at ws 4; the clean table of every
# config, symm timed before p2p now; the p2p-first slowdown reproduced with profiler traces of symm, to
# compare with the clean run's); issue 8 (the TP block under graphs, fused vs unfused: 1.016x once).
# Call B: issue 6 (the Llama step under graphs after the forward's ops are priced as captured: expect more
# than 13 rewrites); issue 3 (mm_rs at ws 4 ran on the Triton kernel, local K 1792 < RS_CUBLAS_MIN_K: the
# probe's "kernel replayed" vs "cuBLAS path replayed, by band GFLOP" says whether cuBLAS wins there, and
# sets RS_CUBLAS_BAND_FLOPS_CAPTURED); issue 6's "no model slower than Inductor by > 2%" at 4 GPUs
# (Mixtral EP and serving too). Call C: the ws-4 symm tests of the peer-store and Triton-kernel
# variants, the rest of the MoE tests at ws 4.
if [ "${PART:-A}" = A ]; then
TAILN=8 run t4_moe 300 env OVERLAP_TEST_TIMEOUT_S=290 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_moe.py -k "ws4-symm-ce and not only"
TAILN=30 run moe4 150 python -m torch.distributed.run --standalone --nproc-per-node=4 bench/bench_moe.py --out $RES --configs deepseek,mixtral,deepseek-decode,mixtral-decode --routing balanced,skewed --comm-sms '' --sweep ''
TAILN=6 run moe4_diag 60 python -m torch.distributed.run --standalone --nproc-per-node=4 bench/bench_moe.py --out $RES/p2p_first --configs deepseek --routing balanced --comm-sms '' --sweep '' --p2p-first --trace $TRACES
TAILN=12 run epi4_g 90 python -m torch.distributed.run --standalone --nproc-per-node=4 bench/bench_epilogue.py --out-dir $RES --block tp --mode train --cudagraphs
elif [ "${PART:-A}" = B ]; then
TAILN=25 run models4_g 140 python -m torch.distributed.run --standalone --nproc-per-node=4 bench/bench_models.py --out $RES --mode reduce-overhead --sections llama --variants inductor,overlap
TAILN=40 run models4 200 python -m torch.distributed.run --standalone --nproc-per-node=4 bench/bench_models.py --out $RES --sections llama,mixtral,serve --variants inductor,async_tp,overlap
TAILN=8 run probe4_rs 150 python -m torch.distributed.run --standalone --nproc-per-node=4 bench/probe_symm.py --ops mm_rs
elif [ "${PART:-A}" = C ]; then
TAILN=12 run t4_pk 300 env OVERLAP_TEST_TIMEOUT_S=140 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "ws4 and symm and (peer or kernel)"
TAILN=12 run t4_moe_rest 240 env OVERLAP_TEST_TIMEOUT_S=230 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_moe.py -k "ws4 and (p2p or compiled)"
fi
# With only nvidia-h200-x2 lent: PART=X2 (the same questions at 2 GPUs).
if [ "${PART:-A}" = X2 ]; then
TAILN=6 run moe2_diag 90 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_moe.py --out $RES/p2p_first --configs deepseek --routing balanced --comm-sms '' --sweep '' --p2p-first --trace $TRACES
TAILN=6 run moe2_clean 60 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_moe.py --out $RES --configs deepseek --routing balanced --comm-sms '' --sweep '' --no-p2p --trace $TRACES/clean
TAILN=16 run models2_g 120 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_models.py --out $RES --mode reduce-overhead --sections llama --variants inductor,overlap
TAILN=12 run epi2_g 100 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_epilogue.py --out-dir $RES --block tp --mode train --cudagraphs
fi
