# One GPU (H200 or H100), a fresh or warm machine: the MoE expert GEMMs now and as they were before the expert-major
# raster across an expert's sources and the 64-row down tile (that commit's overlap_backend/ and bench/, unpacked
# for the call, carried as an ignored path and not committed:
#   mkdir .ab_before && git archive 0c3605a~1 overlap_backend bench/suites bench/tools | tar -x -C .ab_before
# ), then the op's numerics with both tile orders, every rank on this GPU, then the CTA decode-tile stages in what
# is left (run_stages runs in bench/).
TAILN=28 run moe_after 130 python suites/bench_kernels.py --out $RES/moe_after --kernels moe_gate_up,moe_down --budget-s 95
TAILN=28 run moe_before 130 python ../.ab_before/bench/suites/bench_kernels.py --out $RES/moe_before --kernels moe_gate_up,moe_down --budget-s 95
P="env PYTHONPATH=.. OVERLAP_TEST_SHARED_GPU=1 python -m pytest -q -rA -p no:cacheprovider"
TAILN=6 run moe_numerics 200 $P -n 2 ../tests/gpu/test_gpu_moe.py -k "repeated and symm-default and (ws2 or ws4)"
source "$(dirname "$STAGES")/h200x1_cta_decode.sh"
