# Session 19, call 5 (nvidia-h200-x2, lent late in the session, ~500 s of device time left): the mm_rs kernel's
# TMA variant (on by default since session 18) on two real GPUs; whether the shared-GPU failures of call 4
# (timeout message, CTA compiled path count) happen on two GPUs too; RS_TMA on vs off in the op, replayed.
#   DEADLINE=440 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session19/commands/stages5_x2.sh
TR="python -m torch.distributed.run --standalone --nproc-per-node=2"
P="python -m pytest -q -s -p no:cacheprovider"
export OVERLAP_TEST_TIMEOUT_S=140
TAILN=10 run t_rstma 150 $P tests/test_gpu.py -k "ws2 and symm-rstma and (ops_numerics or repeated_calls)"
TAILN=8 run t_timeout 45 $P tests/test_gpu.py::test_symm_timeout_names_op_rank_flag
TAILN=8 run t_cta_comp 70 $P "tests/test_gpu_cta.py::test_cta_pipeline_symm_compiled[ws2]"
TAILN=24 run rs_default 75 $TR bench/bench_collective_gemm.py --suite mm_rs --lowerings symm --out-dir $RES/default --graphs
TAILN=24 run rs_ptronly 75 $TR bench/bench_collective_gemm.py --suite mm_rs --lowerings symm --out-dir $RES/ptronly --graphs --set runtime.symm_lowering.RS_TMA=False
