# The next GPU call (nvidia-h200-x2), for what this session changed after its device time ran out,
# and what it found worth measuring next:
#  - mm_rs's cuBLAS path computes the own partial before the wait only where the chunk is one band
#    (symm_lowering.RS_OWN_FIRST; run 6 measured own-first for every band: better at one band, worse
#    at three); the two orders were each GPU-tested in run 6, the rule choosing between them is
#    CPU-tested. Expect mm_rs M=4096 ~0.456 ms replayed and M=8192 ~0.84.
#  - issue 6's second criterion under CUDA graphs: Inductor with _micro_pipeline_tp (async_tp).
#  - the CTA op at M <= 128: stage 1 alone in narrower tiles (its 32 CTAs of 128x256 do not saturate HBM).
#   mkdir devrun; cp bench/results/2026-11-30_h200x2_session6/commands/dev_run.sh bench/results/2026-11-30_h200x2_session14/commands/next.sh devrun/
#   DEADLINE=560 bash devrun/dev_run.sh devrun/next.sh
TAILN=6 run t_rs 170 env OVERLAP_TEST_TIMEOUT_S=160 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu.py -k "(ws2 and (ops_numerics or repeated_calls) and symm and not peer and not kernel) or captured_symm_ops_replay"
TAILN=4 run t_epi 110 env OVERLAP_TEST_TIMEOUT_S=100 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_epilogues.py -k "ws2 and numerics and symm and not peer"
TAILN=40 run bench_cg 90 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_collective_gemm.py --suite mm_rs,mm_ar --lowerings symm --graphs --out-dir $RES
TAILN=20 run models_g 120 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/bench_models.py --out $RES --mode reduce-overhead --sections llama --variants inductor,async_tp,overlap
TAILN=12 run probe_s1 60 python -m torch.distributed.run --standalone --nproc-per-node=2 bench/probe_cta.py --sizes 16,128 --stage1-variants bn128,bn64,bm64+bn128
