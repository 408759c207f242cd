# One GPU: CTA stage 0 + tanh GELU at every world size's decode shapes (16 and 128 rows: the shapes whose stage 0 splits
# K) with its split runs as set (the fix-up kernel at 65-128 rows) and stream-K (knobs.cta.STAGE0_STREAM_K: every SM an
# equal share of all tiles' K-steps), at 65-128 rows and at every split call, each pair twice in turn in one call;
# each result checked against float32 by the benchmark. Then the CTA op at 2 ranks sharing the GPU, which runs its
# splitting cases with stream-K too.
SWEEP0="python bench/suites/bench_kernels.py --kernels cta_stage0 --max-rows 128 --no-variants --budget-s 40"
STREAM="--set cta.STAGE0_STREAM_K=True"
TAILN=8 run cta0_runs 55 $SWEEP0 --out $RES/cta0_runs
TAILN=8 run cta0_stream_k 55 $SWEEP0 --out $RES/cta0_stream_k $STREAM
TAILN=8 run cta0_stream_k_all 55 $SWEEP0 --out $RES/cta0_stream_k_all $STREAM --set "cta.STAGE0_FIXUP_CALL_ROWS=(1,128)"
TAILN=8 run cta0_runs_2 55 $SWEEP0 --out $RES/cta0_runs_2
TAILN=8 run cta0_stream_k_2 55 $SWEEP0 --out $RES/cta0_stream_k_2 $STREAM
TAILN=8 run cta0_stream_k_all_2 55 $SWEEP0 --out $RES/cta0_stream_k_all_2 $STREAM --set "cta.STAGE0_FIXUP_CALL_ROWS=(1,128)"
TAILN=8 run cta_ws2 200 env OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=15 python -m pytest -x -s -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_cta.py -k "symm_numerics and ws2"
