# run 9 (nvidia-h200, one GPU). At that commit --stage0 timed the op's stage-0 kernel with its pointer
# stores only; the tma_store=True line it prints now came later (STAGE0_TMA_STORE, not yet on a GPU).
export PYTHONPATH=$PWD; timeout 200 python bench/probe_ws.py --shapes 1024x8192x28672,512x8192x28672,4096x8192x28672 --configs 128x256x64x3x8,128x128x64x4x4 --gelu --stage0 2>&1 | tee $OUT/probe_ws2.log
