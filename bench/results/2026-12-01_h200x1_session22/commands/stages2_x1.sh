# Session 22, call 2 (one H200, ranks sharing it): the prologue hoist compiled with Inductor on the symm
# kernels (ws 2), the peer-store path of the changed mm_rs kernel (call 1 cut it at 100 s), mm_ar's copy
# tiles with four ranks.
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=230
P="python -m pytest -q -s -p no:cacheprovider"
TAILN=8 run sh_prologue 250 $P "tests/test_gpu_epilogues.py::test_compiled_prologues_vs_eager[ws2-symm]"
TAILN=12 run sh_peer 190 $P "tests/test_gpu.py::test_ops_numerics[ws2-symm-peer]"
TAILN=8 run sh_arcopy4 130 $P "tests/test_gpu.py::test_ops_numerics[ws4-symm-arcopy]"
