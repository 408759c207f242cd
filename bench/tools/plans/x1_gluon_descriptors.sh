# One GPU, ranks sharing it: the Gluon kernels with every partition making the TMA descriptors it copies through
# (gluon_ring.partition_descriptor). The ops at 2 ranks running both Gluon kernels in both forms (ag_mm plain and with
# a fused bias + GELU, mm_rs), three times over (before: a wrong ag_mm result in 2 of 4 such calls), then their GPU tests.
TAILN=12 run measured_variant 200 bash -c 'for i in 1 2 3; do env OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -s -p no:cacheprovider -m gpu tests/gpu/test_gpu_kernel_variants.py -k measured_variant 2>&1 | grep -E "rel errs|passed|failed|PASS|FAIL|XPASS"; done'
TAILN=8 run ws_tests 200 python -m pytest -q -rA -p no:cacheprovider -m gpu tests/gpu/test_gpu_kernel_variants.py -k "(ws_ or gluon) and not measured_variant"
