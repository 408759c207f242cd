# Second call on nvidia-h200-x4: the A/Bs behind issue 3's mm_rs / mm_ar misses at ws 4, then the TP block
# (issue 6's "never > 2% slower than Inductor", issue 8's fused-epilogue bar).
#   DEADLINE=560 bash bench/run_stages.sh bench/results/2026-12-01_h200x1_session23/commands/next_x4_call2.sh
TR="python -m torch.distributed.run --standalone --nproc-per-node=4"
export OVERLAP_TIMEOUT_S=30
# each peer's pushes on its own stream (off by default; ws 4's mm_rs spent ~0.1 ms of 0.303 on one push stream)
TAILN=30 run cg4_perpeer 90 $TR bench/bench_collective_gemm.py --suite mm_rs,mm_ar --lowerings symm --graphs --out-dir $RES/perpeer --set runtime.symm.PUSH_STREAM_PER_PEER=True
# mm_rs on cuBLAS bands at ws 4's local K (1792, 512) instead of the Triton kernel (1.26x cuBLAS there, one H200)
TAILN=30 run cg4_rscublas 90 $TR bench/bench_collective_gemm.py --suite mm_rs --lowerings symm --graphs --out-dir $RES/rscublas --set runtime.symm_lowering.RS_CUBLAS_MIN_K=512
# mm_ar's rounds kernel copying the peers' bands out itself (off by default)
TAILN=30 run cg4_arcopy 80 $TR bench/bench_collective_gemm.py --suite mm_ar --lowerings symm --out-dir $RES/arcopy --set runtime.symm_lowering.AR_KERNEL_COPY_OUT=True
TAILN=20 run block4 140 $TR bench/bench_block.py --out-dir $RES --variants inductor,async_tp,overlap,overlap_symm --rounds 3
TAILN=20 run epi4 130 $TR bench/bench_epilogue.py --out-dir $RES --block tp --mode train --cudagraphs
