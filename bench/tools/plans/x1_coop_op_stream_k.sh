# One GPU, a short call: mm_rs's cooperative Gluon form in the op at 2 ranks sharing the GPU (the ops tune over the
# measured variant and must take it; each result checked against float32), then CTA stage 0 at every shape with every
# variant, its stream-K forms among them (a split call's runs as every SM's share, "stream_k"; an unsplit call's last,
# partial round so, "stream_k_tail"), each config's calls alternating with cuBLAS's, each result checked against float32.
TAILN=10 run coop_op 80 env OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=15 python -m pytest -x -s -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_kernel_variants.py -k "test_ops_run_the_measured_variant and gluon_coop_both"
TAILN=20 run cta0_variants 150 python bench/suites/bench_kernels.py --kernels cta_stage0 --budget-s 110 --out $RES/cta0_variants
