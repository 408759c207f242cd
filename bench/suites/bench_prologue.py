"""Benchmark of the prologue hoist: all-gather → norm → Q/K/V projection, inference, compiled three ways.

    torchrun --nproc-per-node=N bench/suites/bench_prologue.py --out-dir DIR [--norm rms,layer]
        [--batch 4 --seq 2048 --hidden 4096] [--variants inductor,overlap,overlap_symm,overlap_p2p]
        [--rounds 3] [--graphs] [--device cpu]

The layer gathers its sequence shard first and normalises the full sequence (``all_gather(x, 1) →
RMSNorm / LayerNorm → linear``, one fused Q/K/V weight of ``3·hidden/ws`` columns per rank), the form
``passes/prologue.py`` rewrites into ``norm on the shard → ag_mm`` with the norm's weight (and bias)
folded into the projection's. Each rank holds its own weights. Variants:

- ``eager``: the module as is (the reference of every check);
- ``inductor``: ``torch.compile`` with Inductor (the gather not overlapped);
- ``overlap``: ``backend="overlap"`` as a user gets it (the cost model deciding);
- ``overlap_symm`` / ``overlap_p2p``: every match rewritten on that lowering (``cost_model="off"``).

Each compiled variant is checked first against eager (relative error, max over ranks; <= 1e-2 in
bf16, 1e-4 in float32; else FAIL) and reports what the pass moved and folded; then the variants are
timed in ``--rounds`` interleaved rounds (``Timing.bench``: warm-up, median of >= 20 calls bracketed
by CUDA events, maximum over ranks; the median of the rounds). ``--graphs``: each CUDA variant is also
captured in a CUDA graph and its replays timed (GPU time only). Rank 0 writes
``DIR/prologue_ws<N>.md`` and ``.json``. ``--device cpu``: a gloo smoke run at tiny sizes, float32,
without Inductor (its C++ codegen is slow on the CI machine).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # repo root: overlap_backend, bench

from bench.tools import common  # noqa: E402  (sets the NVLink-multicast-off environment first)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import overlap_backend  # noqa: E402
from overlap_backend.models.tp import all_gather  # noqa: E402  (torch 2.11: the one Dynamo traces at dim 1)

VARIANTS = ("inductor", "overlap", "overlap_symm", "overlap_p2p")


class GatherNormQKV(nn.Module):
    """``linear(norm(all_gather(x, 1)), w_qkv)``: this rank's column shard of Q/K/V."""

    def __init__(self, norm: str, hidden: int, ws: int, dtype, device, rank: int):
        super().__init__()
        g = torch.Generator(device="cpu").manual_seed(1000 + rank)  # each rank its own weights

        def rnd(*shape, scale=1.0):
            return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

        self.norm, self.hidden, self.group = norm, hidden, dist.group.WORLD
        self.norm_weight = nn.Parameter(1 + 0.1 * rnd(hidden), requires_grad=False)
        self.norm_bias = nn.Parameter(0.1 * rnd(hidden), requires_grad=False) if norm == "layer" else None
        self.qkv = nn.Parameter(rnd(3 * hidden // ws, hidden, scale=hidden**-0.5), requires_grad=False)

    def forward(self, x):
        h = all_gather(x, 1, self.group)
        if self.norm == "rms":
            h = F.rms_norm(h, (self.hidden,), self.norm_weight, 1e-6)
        else:
            h = F.layer_norm(h, (self.hidden,), self.norm_weight, self.norm_bias)
        return F.linear(h, self.qkv)


def _compiled(name: str, model: nn.Module, cpu: bool):
    """(the compiled model, its overlap backend or None)."""
    if name == "inductor":
        return torch.compile(model), None
    kw = {} if name == "overlap" else {"lowering": name.removeprefix("overlap_"), "cost_model": "off"}
    backend = overlap_backend.make_backend(inductor=not cpu, **kw)
    return torch.compile(model, backend=backend), backend


def _rewrites(backend) -> str:
    out = []
    for r in backend.reports:
        for m in r.matches:
            if m.pass_name != "ag_mm":
                continue
            if not m.applied:
                out.append(f"not rewritten: {m.reason}")
                continue
            pro = m.prologue or {}
            folded = "; ".join(v for k, v in pro.items() if k.startswith("folded"))
            out.append(f"{m.lowering}: moved {len(pro.get('moved_before_gather', []))} ops"
                       + (f", folded {folded}" if folded else ""))
    return " | ".join(out) or "no ag_mm match"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default="bench/results")
    ap.add_argument("--norm", default="rms,layer")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048, help="gathered sequence length")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--graphs", action="store_true")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args()
    cpu = args.device == "cpu"
    if cpu:
        args.batch, args.seq, args.hidden = 2, 16, 32
    rank, ws, device = common.init_distributed(args.device)
    dtype = torch.float32 if cpu else torch.bfloat16
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    info = common.machine_info(device, ws)
    timing = common.Timing(device)
    rows, failed = [], False
    variants = [v for v in args.variants.split(",") if v and not (cpu and v == "inductor")]
    for norm in args.norm.split(","):
        model = GatherNormQKV(norm, args.hidden, ws, dtype, device, rank)
        x = torch.randn(args.batch, args.seq // ws, args.hidden, device=device, dtype=dtype)
        with torch.no_grad():
            ref = model(x)
            base = {"norm": norm, "tokens": args.batch * args.seq, "hidden": args.hidden,
                    "n": 3 * args.hidden // ws}
            eager_row = {**base, "variant": "eager", "status": "ok"}
            rows.append(eager_row)
            timed = [(eager_row, lambda: model(x))]
            for name in variants:
                row = {**base, "variant": name}
                try:
                    torch._dynamo.reset()
                    fn, backend = _compiled(name, model, cpu)
                    err = common.allreduce_max([common.rel_err(fn(x).float(), ref.float())], device)[0]
                    row["rel_err"] = err
                    row["rewrites"] = _rewrites(backend) if backend is not None else ""
                    if not err <= tol:
                        row["status"], failed = f"FAIL: rel err {err:.3e} > {tol:g}", True
                    else:
                        row["status"] = "ok"
                        timed.append((row, lambda fn=fn: fn(x)))
                        if args.graphs and not cpu:
                            graph = common.capture_graph(lambda fn=fn: fn(x))
                            timed.append(({**base, "variant": f"{name} (CUDA graph)", "status": "ok"}, graph.replay))
                except Exception as e:  # noqa: BLE001 - recorded, the other variants still run
                    row["status"], failed = f"FAIL: {type(e).__name__}: {str(e)[:200]}", True
                    if rank == 0:
                        traceback.print_exc()
                rows.append(row)
            common.time_in_rounds(timed, args.rounds, timing)
            rows += [r for r, _ in timed if "CUDA graph" in r["variant"]]
    if rank == 0:
        headers = ["norm", "variant", "time ms", "rounds ms", "rel err", "status", "what the pass did"]
        table = [[r["norm"], r["variant"], common.fmt_ms(r.get("time_ms")),
                  ", ".join(f"{v:.3f}" for v in r.get("round_ms", [])), f"{r.get('rel_err', 0):.2e}",
                  r.get("status", "ok"), r.get("rewrites", "")] for r in rows]
        text = (f"# all_gather → norm → QKV, ws {ws}\n\n{common.info_markdown(info)}\n- tokens {args.batch * args.seq}, "
                f"hidden {args.hidden}, {dtype}\n\n{common.markdown_table(headers, table)}\n")
        (out_dir / f"prologue_ws{ws}.md").write_text(text)
        common.write_json(out_dir / f"prologue_ws{ws}.json", {"info": info, "rows": rows})
        print(text, flush=True)
    common.shutdown()
    common.exit_now(1 if failed else 0)


if __name__ == "__main__":
    main()
