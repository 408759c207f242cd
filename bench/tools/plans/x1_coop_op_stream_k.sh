# One GPU, a short call: mm_rs's cooperative Gluon form in the op at 2 ranks sharing the GPU (the ops tune over the
# measured variant and must take it; each result checked against float32), then CTA stage 0 at the decode shapes
# with its split runs as set and stream-K (knobs.cta.STAGE0_STREAM_K), then at every shape with whole tiles and its
# last round stream-K (knobs.cta.STAGE0_STREAM_K_TAIL), each checked against float32.
TAILN=10 run coop_op 80 env OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=15 python -m pytest -x -s -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_kernel_variants.py -k "test_ops_run_the_measured_variant and gluon_coop_both"
SWEEP0="python bench/suites/bench_kernels.py --kernels cta_stage0 --max-rows 128 --no-variants --budget-s 25"
TAILN=8 run cta0_runs 40 $SWEEP0 --out $RES/cta0_runs
TAILN=8 run cta0_stream_k 40 $SWEEP0 --out $RES/cta0_stream_k --set cta.STAGE0_STREAM_K=True
ALL0="python bench/suites/bench_kernels.py --kernels cta_stage0 --no-variants --budget-s 50"
TAILN=17 run cta0_whole 65 $ALL0 --out $RES/cta0_whole
TAILN=17 run cta0_tail 65 $ALL0 --out $RES/cta0_tail --set cta.STAGE0_STREAM_K_TAIL=True
