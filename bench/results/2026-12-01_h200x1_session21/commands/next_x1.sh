# For the next session if only nvidia-h200 (one GPU) is lent again: session 21's CPU-only changes on real kernels,
# every rank on the one GPU (correctness, not speed).
#   DEADLINE=560 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session21/commands/next_x1.sh
# - mm_ar's copy tiles (AR_KERNEL_COPY_OUT): the symm-arcopy variant's op numerics and 100 repeated calls, ws 2 and 4;
# - the growth agreement's compare_set verdict (the disagreement test);
# - the READY-report operand order recompiled in mm_rs (peer stores), cta and moe_comm (the comm kernel variant).
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=200
P="python -m pytest -q -s -p no:cacheprovider"
TAILN=10 run sh_arcopy 220 $P tests/test_gpu.py -k "symm-arcopy and (ws2 or ws4) and (numerics or repeated)"
TAILN=6 run sh_growth 60 $P tests/test_gpu.py::test_symm_growth_disagreement_raises_instead_of_hanging
TAILN=6 run sh_peer 120 $P tests/test_gpu.py -k "ws2 and symm-peer and repeated"
TAILN=6 run sh_cta 130 $P "tests/test_gpu_cta.py::test_cta_pipeline_symm_numerics[ws2]"
