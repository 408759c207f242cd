# Session 22, call 5 (one H200, two ranks sharing it): the prologue test with LayerNorm's weight and bias
# folded into the matmul's weight and bias (added after call 4).
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=200
P="python -m pytest -q -s -p no:cacheprovider"
TAILN=10 run sh_prologue 200 $P "tests/test_gpu_epilogues.py::test_compiled_prologues_vs_eager[ws2-symm]"
