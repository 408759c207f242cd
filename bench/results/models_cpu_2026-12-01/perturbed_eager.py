"""CPU, 2 gloo ranks: is the Mixtral curve's drift at lr=1e-2 the training's own sensitivity? Two EAGER runs of
bench_models' mixtral_curve CPU model, the second with one weight scaled by (1 + 1e-7) (float32 rounding size), at
lr=1e-2 and lr=1e-3; prints the max relative loss difference per 50 steps. No backend involved.

    torchrun --nproc-per-node=2 bench/results/2026-12-01_cpu_curves/perturbed_eager.py
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from bench.bench_models import CPU, _split  # noqa: E402
from overlap_backend.mixtral import MixtralConfig, build_mixtral, sync_dense_grads  # noqa: E402
from overlap_backend.train import train  # noqa: E402

dist.init_process_group("gloo")
cfg_kw, run = _split(CPU["mixtral_curve"])
cfg = MixtralConfig(**cfg_kw, seq_len=run["seq"])
for lr in (1e-2, 1e-3):
    curves = []
    for eps in (0.0, 1e-7):
        model = build_mixtral(cfg, seed=0, device=torch.device("cpu"), dtype=torch.float32)
        with torch.no_grad():
            next(model.parameters()).mul_(1 + eps)
        curves.append(train(model, 300, batch=run["batch"], seq_len=run["seq"], vocab=cfg.vocab_size, lr=lr, seed=0,
                            device=torch.device("cpu"), data_parallel=True,
                            grad_hook=lambda m=model: sync_dense_grads(m)))
    rel = [abs(a - b) / abs(b) for a, b in zip(*curves)]
    if dist.get_rank() == 0:
        print(f"lr={lr:g}: max rel loss diff, eager vs eager with one weight x (1 + 1e-7), steps 0-49, 50-99, ...: "
              + ", ".join(f"{max(rel[i:i + 50]):.1e}" for i in range(0, 300, 50)), flush=True)
dist.destroy_process_group()
