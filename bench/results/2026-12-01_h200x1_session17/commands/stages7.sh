# Call 7, one H200: the one-GPU GPU tests (stream operations, fast launch path) and the CTA stage-0
# kernel alone after its fence helpers moved to codegen/flags.py (compiles, numerics, time).
TAILN=8 run t1 200 python -m pytest -q tests/test_gpu.py -k "fast_path or fast_triton"
TAILN=12 run stage0 150 python bench/probe_ws.py --shapes 1024x8192x28672,4096x8192x28672 --configs 128x256x64x3x8 --no-ws --stage0
