# Call 4 on nvidia-h200-x4: under CUDA graphs (host time per call gone) the Llama step and the TP block;
# MoE schedules at EP 4 (symm was 1.79x max(experts, a2a) in call 3); the MoE and epilogue GPU tests at ws 4, one per stage.
TAILN=25 run models4_g 130 python -m torch.distributed.run --standalone --nproc-per-node=4 bench/bench_models.py --out $RES --mode reduce-overhead --sections llama --variants inductor,overlap
TAILN=12 run epi4_g 110 python -m torch.distributed.run --standalone --nproc-per-node=4 bench/bench_epilogue.py --out-dir $RES --block tp --mode train --cudagraphs
TAILN=25 run moe4_sweep 90 python -m torch.distributed.run --standalone --nproc-per-node=4 bench/bench_moe.py --out $RES --configs deepseek --routing balanced --comm-sms '' --sweep ce-only,order=source,schedule=rotated --no-p2p
TAILN=8 run t4_moe 120 env OVERLAP_TEST_TIMEOUT_S=110 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_moe.py -k "ws4-symm-ce and not only"
TAILN=8 run t4_epi 90 env OVERLAP_TEST_TIMEOUT_S=85 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_gpu_epilogues.py -k "ws4 and numerics and symm and not peer"
