# One GPU, whichever card comes (run_stages runs in bench/). On an H200: the kernel benchmark of record (each config
# call by call against cuBLAS; it replaces kernels_h200x1_2026-12-06/record, timed one config after the other).
# On an H100: the MoE down (then gate/up) kernel over more block configs than the op tunes over (4 stages; BK 128
# in 2 stages; 256-row tiles; GROUP_M 4 and 16; 128x128 tiles; smaller tiles for decode), each config paired with
# torch._grouped_mm: which configs would close the down kernel's 1.16-1.25x at DeepSeek-like prefill.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  TAILN=12 run kernels_h200 440 python suites/bench_kernels.py --out $RES/kernels_h200 --budget-s 380
else
  TAILN=16 run moe_down_configs 200 python suites/bench_kernels.py --out $RES/moe_down_configs --kernels moe_down --budget-s 170 --set "codegen.MOE_DOWN_16BIT=((128, 256, 64, 8, 3, 8, False), (64, 256, 64, 8, 3, 8, False), (128, 256, 64, 8, 4, 8, False), (128, 256, 128, 8, 2, 8, False), (256, 128, 64, 8, 3, 8, False), (128, 256, 64, 16, 3, 8, False), (128, 256, 64, 4, 3, 8, False), (128, 128, 64, 8, 4, 8, False), (64, 128, 64, 8, 4, 4, False))"
  TAILN=16 run moe_gate_up_configs 150 python suites/bench_kernels.py --out $RES/moe_gate_up_configs --kernels moe_gate_up --budget-s 120 --set "codegen.MOE_GATE_UP_16BIT=((128, 128, 64, 8, 3, 8, False), (64, 256, 64, 8, 3, 8, False), (128, 128, 64, 8, 4, 8, False), (128, 128, 64, 16, 3, 8, False), (64, 128, 64, 8, 4, 4, False), (128, 64, 64, 8, 4, 4, False))"
fi
