# One GPU: CTA stage 0 + tanh GELU with stream-K, each result checked against float32 by the benchmark, each pair of
# runs twice in turn in one call. At every world size's decode shapes (16 and 128 rows: stage 0 splits K): its split
# runs as set (the fix-up kernel at 65-128 rows) against stream-K (knobs.cta.STAGE0_STREAM_K), at 65-128 rows and at
# every split call. At every shape: whole tiles against the last, partial round stream-K
# (knobs.cta.STAGE0_STREAM_K_TAIL; the op candidates only, so the Triton kernel). Then the CTA op at 2 ranks sharing
# the GPU, which runs its cases with each stream-K form too.
SWEEP0="python bench/suites/bench_kernels.py --kernels cta_stage0 --max-rows 128 --no-variants --budget-s 40"
ALL0="python bench/suites/bench_kernels.py --kernels cta_stage0 --no-variants --budget-s 70"
STREAM="--set cta.STAGE0_STREAM_K=True"
TAIL="--set cta.STAGE0_STREAM_K_TAIL=True"
TAILN=8 run cta0_runs 55 $SWEEP0 --out $RES/cta0_runs
TAILN=8 run cta0_stream_k 55 $SWEEP0 --out $RES/cta0_stream_k $STREAM
TAILN=8 run cta0_stream_k_all 55 $SWEEP0 --out $RES/cta0_stream_k_all $STREAM --set "cta.STAGE0_FIXUP_CALL_ROWS=(1,128)"
TAILN=17 run cta0_whole 85 $ALL0 --out $RES/cta0_whole
TAILN=17 run cta0_tail 85 $ALL0 --out $RES/cta0_tail $TAIL
TAILN=8 run cta0_runs_2 55 $SWEEP0 --out $RES/cta0_runs_2
TAILN=8 run cta0_stream_k_2 55 $SWEEP0 --out $RES/cta0_stream_k_2 $STREAM
TAILN=17 run cta0_whole_2 85 $ALL0 --out $RES/cta0_whole_2
TAILN=17 run cta0_tail_2 85 $ALL0 --out $RES/cta0_tail_2 $TAIL
TAILN=8 run cta_ws2 200 env OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=15 python -m pytest -x -s -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_cta.py -k "symm_numerics and ws2"
