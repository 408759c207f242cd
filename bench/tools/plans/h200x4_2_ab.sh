# On nvidia-h200-x4, second call: the A/Bs behind mm_rs / mm_ar missing their target at ws 4, then the TP block
# (never > 2% slower than Inductor) and the fused-epilogue step under CUDA graphs.
#   DEADLINE=560 bash bench/tools/run_stages.sh bench/tools/plans/h200x4_2_ab.sh
TR="python -m torch.distributed.run --standalone --nproc-per-node=4"
export OVERLAP_TIMEOUT_S=30
# each peer's pushes on its own stream (off by default; ws 4's mm_rs spent ~0.1 ms of 0.303 on one push stream)
TAILN=30 run cg4_perpeer 90 $TR bench/suites/bench_collective_gemm.py --suite mm_rs,mm_ar --lowerings symm --graphs --out-dir $RES/perpeer --set symm.PUSH_STREAM_PER_PEER=True
# the shape rules instead of the kernel ratios (cuBLAS per band / chunk at long K, as the tables before
# kernels_h200x1_2026-12-06/record ran): on one GPU mm_rs's kernel beat its cuBLAS path at every shape and ag_mm's
# at 20 of 24, transfers left out; this A/B against h200x4_1's cg4 tables says whether that holds with them
TAILN=30 run cg4_rules 120 $TR bench/suites/bench_collective_gemm.py --suite ag_mm,mm_rs --lowerings symm --graphs --out-dir $RES/rules --set symm.CUBLAS_ABOVE_RATIO=None
# mm_ar's rounds kernel copying the peers' bands out itself (off by default)
TAILN=30 run cg4_arcopy 80 $TR bench/suites/bench_collective_gemm.py --suite mm_ar --lowerings symm --out-dir $RES/arcopy --set symm.AR_KERNEL_COPY_OUT=True
TAILN=20 run block4 140 $TR bench/suites/bench_block.py --out-dir $RES --variants inductor,async_tp,overlap,overlap_symm --rounds 3
TAILN=20 run epi4 130 $TR bench/suites/bench_epilogue.py --out-dir $RES --block tp --mode train --cudagraphs
