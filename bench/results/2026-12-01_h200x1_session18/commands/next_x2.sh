# For a session that gets nvidia-h200-x2 (per-peer streams change nothing at 2 GPUs):
#   DEADLINE=545 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session18/commands/next_x2.sh
# The mm_rs kernel's TMA variant on 2 GPUs (the copy engine reads what TMA stores wrote), its new tile loop
# (for, then while) under real waits, and whether the TMA variant (now a default tuning candidate) pays in the op.
TR="python -m torch.distributed.run --standalone --nproc-per-node=2"
TAILN=12 run t_rstma 220 python -m pytest -q -x tests/test_gpu.py -k "ws2 and (symm-rstma or symm-kernel) and (ops_numerics or repeated_calls)"
TAILN=12 run t_capt 100 python -m pytest -q -x tests/test_gpu.py -k "captured_symm_ops_replay"
TAILN=30 run rs_default 80 $TR bench/bench_collective_gemm.py --suite mm_rs,mm_ar --lowerings symm --out-dir $RES/default --graphs
TAILN=30 run rs_ptronly 80 $TR bench/bench_collective_gemm.py --suite mm_rs --lowerings symm --out-dir $RES/ptronly --graphs --set runtime.symm_lowering.RS_TMA=False
