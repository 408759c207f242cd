# On nvidia-h200-x4, second call: the A/Bs behind mm_rs / mm_ar missing their target at ws 4, then the TP block
# (never > 2% slower than Inductor) and the fused-epilogue step under CUDA graphs.
#   DEADLINE=560 bash bench/tools/run_stages.sh bench/tools/plans/h200x4_2_ab.sh
TR="python -m torch.distributed.run --standalone --nproc-per-node=4"
export OVERLAP_TIMEOUT_S=30
# each peer's pushes on its own stream (off by default; ws 4's mm_rs spent ~0.1 ms of 0.303 on one push stream)
TAILN=30 run cg4_perpeer 90 $TR bench/suites/bench_collective_gemm.py --suite mm_rs,mm_ar --lowerings symm --graphs --out-dir $RES/perpeer --set symm.PUSH_STREAM_PER_PEER=True
# mm_rs on cuBLAS bands at ws 4's local K (1792, 512) instead of the Triton kernel (1.26x cuBLAS there, one H200)
TAILN=30 run cg4_rscublas 90 $TR bench/suites/bench_collective_gemm.py --suite mm_rs --lowerings symm --graphs --out-dir $RES/rscublas --set symm.RS_CUBLAS_MIN_K=512
# mm_ar's rounds kernel copying the peers' bands out itself (off by default)
TAILN=30 run cg4_arcopy 80 $TR bench/suites/bench_collective_gemm.py --suite mm_ar --lowerings symm --out-dir $RES/arcopy --set symm.AR_KERNEL_COPY_OUT=True
TAILN=20 run block4 140 $TR bench/suites/bench_block.py --out-dir $RES --variants inductor,async_tp,overlap,overlap_symm --rounds 3
TAILN=20 run epi4 130 $TR bench/suites/bench_epilogue.py --out-dir $RES --block tp --mode train --cudagraphs
