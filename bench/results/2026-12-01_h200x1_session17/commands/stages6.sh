# Call 6, one H200: a sum of matmuls (the QKV / w1-w3 input gradients) as cat + one mm, as mm + addmm
# accumulation, as separate mms + sum: is the mm_rs rewrite's concatenation worth removing?
TAILN=60 run summm 200 python bench/probe_sum_mm.py --ws 1,2,4
