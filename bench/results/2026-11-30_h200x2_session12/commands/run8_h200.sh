# run 8 (nvidia-h200, one GPU; the `run` tool's command, in the repository root)
export PYTHONPATH=$PWD; timeout 270 python bench/probe_ws.py --shapes 1024x8192x28672,1024x28672x8192,512x8192x28672 --configs 128x256x64x3x8,128x256x64x4x8,128x128x64x4x4 --gelu 2>&1 | tee $OUT/probe_ws.log
