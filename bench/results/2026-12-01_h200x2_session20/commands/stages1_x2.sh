# Session 20, call 1, nvidia-h200-x2:
#   DEADLINE=545 bash bench/run_stages.sh bench/results/2026-12-01_h200x2_session20/commands/stages1_x2.sh
# The watchdog's message with the stream-waited flags (session 19's fix), and the 2-GPU tests session 19 had no time for.
P="python -m pytest -q -s -p no:cacheprovider"
TAILN=8 run t_timeout 45 $P tests/test_gpu.py::test_symm_timeout_names_op_rank_flag tests/test_gpu.py::test_symm_dead_peer_unblocks_stream_waits tests/test_gpu.py::test_symm_dead_peer_in_a_replay
TAILN=8 run t_recomp 120 $P "tests/test_gpu.py::test_recompiles_reuse_group_state"
TAILN=12 run t_models 200 $P tests/test_gpu.py -k "ws2 and (compiled_tp_models or reduce_overhead)"
TAILN=12 run t_epi 150 $P tests/test_gpu_epilogues.py -k "compiled_blocks_fused_vs_eager and ws2"
