# One GPU (H200 or H100): the moe_experts op's numerics with both tile orders (the expert-major raster across an
# expert's sources is in since kernels_h200x1_2026-12-06; its kernels passed their float32 checks there, the op's
# test did not finish in the 188 s left of that call), every rank on this GPU, then the CTA decode-tile stages in
# what is left (run_stages runs in bench/).
P="env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider"
TAILN=6 run moe_numerics 300 $P -n 2 ../tests/gpu/test_gpu_moe.py -k "repeated and symm-default and (ws2 or ws4)"
source "$(dirname "$STAGES")/h200x1_cta_decode.sh"
