# Session 21, call 8, nvidia-h200 (one GPU, one process):
#   DEADLINE=100 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session21/commands/stages8_x1.sh
# Does cuMemcpyAsync need SMs within one process too (device to device on one GPU; to / from pinned host)? If a
# device-to-device copy does, every protocol where a kernel holding all SMs waits for a local copy can hang on real
# machines (the MoE op's own rows), and local copy-outs queued beside a persistent kernel wait for it to finish.
TAILN=12 run copy_sms 80 python bench/probe_copy_sms.py --mib 64 --timeout-s 2 --free 0,4
