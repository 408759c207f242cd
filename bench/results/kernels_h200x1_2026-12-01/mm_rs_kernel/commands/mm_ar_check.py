# one GPU: the mm_rs kernel in its mm_ar form (WRITE_GATHER, 2 rounds), rank 0 of a pretend 2-rank group, flags at
# epoch 0: compiles with the for-then-while ticket loop, and the own rows / gather rows are right.
import torch, triton
from overlap_backend.codegen import mm_rs
from overlap_backend.runtime import symm
dev = torch.device("cuda")
triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))
torch.manual_seed(0)
ws, r, rounds, M, K, N = 2, 0, 2, 4096, 1024, 2048
rows = M // (rounds * ws)
a = torch.randn(M, K, device=dev).bfloat16(); b = (torch.randn(K, N, device=dev) / K**0.5).bfloat16()
recv = torch.randn(rounds * ws * rows, N, device=dev).bfloat16()
gather = torch.full_like(recv, float("nan")); out = torch.full((M, N), float("nan"), device=dev).bfloat16()
stage = torch.empty_like(recv)
nb = -(-rows // symm.band_rows(rows))
fl = [torch.zeros(rounds * ws * nb, dtype=torch.int32, device=dev) for _ in range(3)]
st = (torch.zeros(1, dtype=torch.int32, device=dev), torch.zeros(8, dtype=torch.int32, device=dev))
t = torch.zeros(1, dtype=torch.int32, device=dev)
mm_rs.launch(a, b, None, stage, recv, gather, out, *fl, t, 0, st, 10**9, r, ws, rows, rows, rounds, ws * rows, r * rows,
             False, symm.band_rows(rows), (128, 256, 64, 8, 3, 8, False), 132)
torch.cuda.synchronize()
ref = a.float() @ b.float()
worst = 0.0
for rnd in range(rounds):
    lo = (rnd * ws + r) * rows
    want = ref[lo:lo + rows] + recv[(rnd * ws + 1) * rows:(rnd * ws + 2) * rows].float()
    for got in (out[lo:lo + rows].float(), gather[(rnd * ws + r) * rows:(rnd * ws + r + 1) * rows].float()):
        worst = max(worst, ((got - want).norm() / want.norm()).item())
print(f"mm_ar kernel (2 rounds, pretend ws 2): rel err {worst:.2e}, ticket {t.item()}, status {st[0].item()}")
assert worst < 1e-2 and t.item() == 0 and st[0].item() == 0
