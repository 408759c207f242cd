# One GPU (Hopper): the warp-specialized Gluon GEMM probe against cuBLAS (numerics on poisoned outputs, paired
# timing), B row-major [K, N] at the op kernels' local shapes (M x N x K), then B K-major (w.t()) at five of them.
SH=8192x7168x8192,8192x3584x4096,8192x768x4096,8192x1536x4096,4096x8192x1792,8192x8192x896,32768x7168x2048,1024x28672x8192,512x7168x8192,8192x8192x7168
SHK=8192x7168x8192,8192x768x4096,4096x8192x1792,32768x7168x2048,1024x28672x8192
TAILN=16 run gluon_rowmajor 240 python bench/probes/gluon_ws/gpu_check.py --shapes $SH --out $RES/gluon_rowmajor.json
TAILN=10 run gluon_kmajor 150 python bench/probes/gluon_ws/gpu_check.py --shapes $SHK --b-kmajor --no-sanity --out $RES/gluon_kmajor.json
