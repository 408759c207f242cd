# Session 22, call 3 (one H200, ranks sharing it): the prologue test again (call 2's run segfaulted in
# eager gloo all_gather after a Dynamo graph break around functools.partial; now closures, fullgraph=True);
# the generated epilogues through the changed mm_rs kernel; mm_ar's copy tiles repeated with four ranks.
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=230
P="python -m pytest -q -s -p no:cacheprovider"
TAILN=10 run sh_prologue 250 $P "tests/test_gpu_epilogues.py::test_compiled_prologues_vs_eager[ws2-symm]"
TAILN=14 run sh_epilogues 160 $P "tests/test_gpu_epilogues.py::test_ops_with_epilogues_numerics[ws2-symm]"
TAILN=6 run sh_arcopy4_rep 130 $P "tests/test_gpu.py::test_repeated_calls[ws4-symm-arcopy]"
