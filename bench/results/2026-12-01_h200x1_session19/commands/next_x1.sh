# For a session with one H200 only:
#   DEADLINE=545 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session19/commands/next_x1.sh
# Every rank on the one GPU (numerics and protocol, not speed): what session 19 left cut or unexplained there.
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=200
P="python -m pytest -q -s -p no:cacheprovider"
TAILN=10 run sh_timeout 60 $P tests/test_gpu.py::test_symm_timeout_names_op_rank_flag   # the watchdog names the flags
TAILN=10 run sh_recomp 200 $P "tests/test_gpu.py::test_recompiles_reuse_group_state[symm]"   # cut at 70 s in session 19
TAILN=30 run sh_cta_comp 120 $P "tests/test_gpu_cta.py::test_cta_pipeline_symm_compiled[ws2]"   # now prints the reports
TAILN=8 run sh4_moe_comp 160 $P "tests/test_gpu_moe.py::test_compiled_moe_layer_symm[ws4-dropless-grouped_mm]"
