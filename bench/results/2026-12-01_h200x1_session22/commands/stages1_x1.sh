# Session 22, call 1 (one H200, two ranks sharing it): session 21's kernel changes compiled on a GPU for the first time.
# - the default mm_rs / mm_ar Triton kernel (new gathered_ptr argument, _gemm_tile dispatcher): symm, symm-kernel, symm-peer;
# - mm_ar's copy tiles (AR_KERNEL_COPY_OUT): symm-arcopy numerics and repeated calls;
# - the growth agreement's compare_set verdict; the READY-report operand order in cta.
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=200
P="python -m pytest -q -s -p no:cacheprovider"
TAILN=12 run sh_default 200 $P "tests/test_gpu.py::test_ops_numerics[ws2-symm]" "tests/test_gpu.py::test_ops_numerics[ws2-symm-kernel]"
TAILN=10 run sh_arcopy 150 $P "tests/test_gpu.py::test_ops_numerics[ws2-symm-arcopy]" "tests/test_gpu.py::test_repeated_calls[ws2-symm-arcopy]"
TAILN=8 run sh_peer 100 $P "tests/test_gpu.py::test_ops_numerics[ws2-symm-peer]"
TAILN=6 run sh_growth 50 $P tests/test_gpu.py::test_symm_growth_disagreement_raises_instead_of_hanging
TAILN=6 run sh_cta 100 $P "tests/test_gpu_cta.py::test_cta_pipeline_symm_numerics[ws2]"
