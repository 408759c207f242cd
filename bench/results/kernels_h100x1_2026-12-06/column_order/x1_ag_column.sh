# One GPU: ag_mm's peers' tiles column by column at decode sizes (knobs.codegen.AG_MM_PEERS_BY_COLUMN_ROWS,
# default 128) against chunk by chunk (0), at 4 and 8 GPUs' shapes, in one call; first the GPU test of both
# orders with late shards (run_stages runs in bench/).
TAILN=12 run order_test 200 env PYTHONPATH=.. python -m pytest -q -rA -p no:cacheprovider -m gpu ../tests/gpu/test_gpu_kernel_variants.py -k decode
TAILN=12 run by_column 150 python suites/bench_kernels.py --out $RES/by_column --kernels ag_mm --ws 4,8 --no-variants --budget-s 110
TAILN=12 run by_chunk 150 python suites/bench_kernels.py --out $RES/by_chunk --kernels ag_mm --ws 4,8 --no-variants --budget-s 110 --set codegen.AG_MM_PEERS_BY_COLUMN_ROWS=0
