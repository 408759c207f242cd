# Session 21, call 9, nvidia-h200 (one GPU, one process):
#   DEADLINE=60 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session21/commands/stages9_x1.sh
# Can a copy within one GPU be put on a copy engine? cuMemcpyBatchAsync with CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE
# (a hint), beside a kernel that fills every SM (call 8: a plain cuMemcpyAsync never started there).
TAILN=8 run copy_ce 50 python bench/probe_copy_sms.py --mib 64 --timeout-s 2 --free 0 --kinds none,d2d,d2d_prefer_ce,d2d_prefer_ce_hints
