# Session 22, call 8 (one H200): LayerNorm's bias fold as a bf16 GEMV (b @ W) instead of a float32 copy of W;
# the probe for LayerNorm, and the prologue GPU test (ranks sharing the GPU) on the changed fold.
TAILN=3 run probe_layer_8192 90 python bench/probe_prologue.py --tokens 8192 --hidden 4096 --ws 2 4 --norm layer --reps 50
TAILN=3 run probe_layer_2048 80 python bench/probe_prologue.py --tokens 2048 --hidden 4096 --ws 2 4 --norm layer --reps 50
export OVERLAP_TEST_SHARED_GPU=1 OVERLAP_TIMEOUT_S=30 OVERLAP_TEST_TIMEOUT_S=150
TAILN=4 run sh_prologue 150 python -m pytest -q -s -p no:cacheprovider "tests/test_gpu_epilogues.py::test_compiled_prologues_vs_eager[ws2-symm]"
