# Session 22, call 4 (one H200, two ranks sharing it): the prologue test with the models' all_gather
# (call 3: torch 2.11's all_gather_tensor breaks the graph for gather dim 1).
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=240
P="python -m pytest -q -s -p no:cacheprovider"
TAILN=10 run sh_prologue 250 $P "tests/test_gpu_epilogues.py::test_compiled_prologues_vs_eager[ws2-symm]"
