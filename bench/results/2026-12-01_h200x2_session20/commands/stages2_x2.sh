# Session 20, call 2, nvidia-h200-x2:
#   DEADLINE=330 bash bench/run_stages.sh bench/results/2026-12-01_h200x2_session20/commands/stages2_x2.sh
# The two dead-peer tests call 1's 45 s cap cut (each has a 90 s budget of its own), then the MoE p2p-first
# slowdown under CUDA graphs (the same run times it eagerly; clean replays: session 7, 6.095 ms): if replays (no
# the loss is on the host.
P="python -m pytest -q -s -p no:cacheprovider"
TR="python -m torch.distributed.run --standalone --nproc-per-node=2"
TAILN=8 run t_dead 150 $P tests/test_gpu.py::test_symm_dead_peer_unblocks_stream_waits tests/test_gpu.py::test_symm_dead_peer_in_a_replay
TAILN=10 run moe_p2pfirst_graphs 170 $TR bench/bench_moe.py --out $RES/p2p_first_graphs --configs deepseek --routing balanced --comm-sms '' --sweep '' --p2p-first --graphs
