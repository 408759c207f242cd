# Session 20, call 4, nvidia-h200 (one GPU; x2 no longer lent):
#   DEADLINE=400 bash bench/run_stages.sh bench/results/2026-12-01_h200x2_session20/commands/stages4_x1.sh
# The MoE op's new default (OVERLAP_MOE_COMM_SMS=0: no comm kernel, the op's comm_sms argument -1) with every
# rank on the one GPU: numerics and the protocol, not speed.
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=200
P="python -m pytest -q -s -p no:cacheprovider"
TAILN=8 run sh_moe_default2 130 $P "tests/test_gpu_moe.py::test_moe_op_numerics_repeated[ws2-symm-default]"
TAILN=8 run sh_moe_layer2 130 $P "tests/test_gpu_moe.py::test_compiled_moe_layer_symm[ws2-dropless-grouped_mm]"
TAILN=8 run sh_moe_default4 130 $P "tests/test_gpu_moe.py::test_moe_op_numerics_repeated[ws4-symm-default]"
