"""GPU check of ws_gemm (Hopper, torch + Triton 3.6): correctness against float32, then time against torch.mm.

    python bench/probes/gluon_ws/gpu_check.py [--shapes 8192x8192x7168,...] [--configs coop,pingpong,coop1,pingpong:128x128x64:8:5]
                        [--pairs 50] [--b-kmajor] [--no-sanity] [--out results.json]

Per shape and config: fresh ``torch.randn`` bf16 inputs, the output pre-filled with NaN; error against
``a.float() @ b.float()``: max_rel = max|C - ref| / max|ref| (asserted < 2e-2) and, stricter, max|C - ref| / rms(ref)
(asserted < 0.1: bf16 rounding of the output alone gives about 0.02; a lost K-chunk or tile gives far more). Then
timing: after warm-up, calls alternate cuBLAS / kernel / cuBLAS / ... each between its own CUDA events, queued behind
a GPU sleep so the host's launch cost stays off the clock; each kernel call is divided by the mean of the cuBLAS
calls on either side; median over >= 50 pairs. One table row per shape; ``--out`` writes everything as JSON.
``--b-kmajor`` passes B as ``w.t()`` of a contiguous [N, K] weight (the K-major path) instead of a contiguous [K, N].
Before the table, a few odd shapes (M, N, K not multiples of the tile; K not a multiple of BK) are checked for
correctness only, unless --no-sanity.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import ws_gemm as W  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.tools.common import paired_queued_ms  # noqa: E402

DEFAULT_SHAPES = ("8192x8192x7168,8192x4096x3584,8192x4096x768,4096x1792x8192,8192x896x8192,32768x2048x7168,"
                  "1024x8192x28672,512x8192x7168")
SANITY_SHAPES = ((1000, 1000, 1000), (136, 264, 72), (3000, 520, 2056), (257, 384, 4104))


def make_inputs(M, N, K, b_kmajor, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
    if b_kmajor:
        b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=g).t()
    else:
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=g)
    return a, b


def check(M, N, K, config, b_kmajor, seed):
    """Run once on fresh inputs into a NaN-poisoned output; return (max_rel, max_err / rms(ref))."""
    a, b = make_inputs(M, N, K, b_kmajor, seed)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    W.launch(a, b, out, config)
    torch.cuda.synchronize()
    ref = a.float() @ b.float()
    err = (out.float() - ref).abs().max().item()  # NaN anywhere (an unwritten element) -> NaN -> assert fails
    max_rel = err / ref.abs().max().item()
    rms_rel = err / ref.pow(2).mean().sqrt().item()
    del ref
    return max_rel, rms_rel


def paired_times(fn, ref_fn, pairs):
    """Median kernel ms, median cuBLAS ms, median ratio kernel / mean(cuBLAS before, cuBLAS after): the
    benchmarks' own paired timing (``bench/tools/common.paired_queued_ms``, calls queued behind a GPU spin)."""
    t = paired_queued_ms(fn, ref_fn, n=pairs, warm=10)
    return t.ms, t.baseline_ms, t.ratio


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma list of MxNxK")
    ap.add_argument("--configs", default="coop,pingpong,coop1",
                    help="comma list of variant or variant:BMxBNxBK:GROUP_M:STAGES (ws_gemm.parse_config)")
    ap.add_argument("--pairs", type=int, default=50, help="kernel/cuBLAS pairs timed (>= 50)")
    ap.add_argument("--b-kmajor", action="store_true", help="B as w.t() of a contiguous [N, K] (K-major path)")
    ap.add_argument("--no-sanity", action="store_true", help="skip the odd-shape correctness checks")
    ap.add_argument("--no-time", action="store_true", help="correctness only")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    assert args.pairs >= 50, "median of at least 50 pairs"
    configs = [W.parse_config(c) for c in args.configs.split(",")]
    names = [W.config_name(c) for c in configs]
    shapes = [tuple(int(x) for x in s.lower().split("x")) for s in args.shapes.split(",")]
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}; "
          f"B {'K-major (w.t())' if args.b_kmajor else 'row-major [K, N]'}")
    results = dict(device=props.name, sms=props.multi_processor_count, torch=torch.__version__,
                   b_kmajor=args.b_kmajor, configs=names, sanity=[], shapes=[])
    failures = []

    if not args.no_sanity:
        for (M, N, K) in SANITY_SHAPES:
            for cfg, name in zip(configs, names):
                max_rel, rms_rel = check(M, N, K, cfg, args.b_kmajor, seed=M + N + K)
                ok = max_rel < 2e-2 and rms_rel < 0.1
                print(f"sanity {M}x{N}x{K:<6} {name:<26} max_rel {max_rel:.2e}  err/rms {rms_rel:.2e}"
                      f"{'' if ok else '  FAIL'}")
                results["sanity"].append(dict(shape=[M, N, K], config=name, max_rel=max_rel, err_over_rms=rms_rel))
                if not ok:
                    failures.append(f"sanity {M}x{N}x{K} {name}")

    hdr = f"{'M x N x K':<20} {'cuBLAS ms':>9} " + " ".join(f"{n:>26} {'ratio':>6}" for n in names)
    print(hdr)
    print("-" * len(hdr))
    for (M, N, K) in shapes:
        row = dict(shape=[M, N, K], variants={})
        cells = []
        ref_ms_all = []
        for cfg, name in zip(configs, names):
            t0 = time.time()
            max_rel, rms_rel = check(M, N, K, cfg, args.b_kmajor, seed=M * 7 + N * 3 + K)
            ok = max_rel < 2e-2 and rms_rel < 0.1
            entry = dict(max_rel=max_rel, err_over_rms=rms_rel, ok=ok)
            if not ok:
                failures.append(f"{M}x{N}x{K} {name}: max_rel {max_rel:.3e}, err/rms {rms_rel:.3e}")
            if ok and not args.no_time:
                a, b = make_inputs(M, N, K, args.b_kmajor, seed=1)
                out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
                ref_out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
                fn = W.prepare(a, b, out, cfg)
                ker_ms, ref_ms, ratio = paired_times(fn, lambda: torch.mm(a, b, out=ref_out), args.pairs)
                entry.update(ms=ker_ms, cublas_ms=ref_ms, ratio=ratio,
                             tflops=2 * M * N * K / ker_ms * 1e-9)
                ref_ms_all.append(ref_ms)
                cells.append(f"{ker_ms:>26.4f} {ratio:>6.3f}")
                del a, b, out, ref_out
            else:
                cells.append(f"{'FAIL' if not ok else 'ok (untimed)':>26} {'':>6}")
            entry["seconds"] = time.time() - t0
            print(f"    {M}x{N}x{K} {name}: max_rel {max_rel:.2e}, err/rms {rms_rel:.2e}"
                  + (f", {entry['ms']:.4f} ms ({entry['tflops']:.0f} TFLOP/s), x{entry['ratio']:.3f} cuBLAS"
                     if "ms" in entry else ""), flush=True)
            row["variants"][name] = entry
        row["cublas_ms"] = statistics.median(ref_ms_all) if ref_ms_all else None
        results["shapes"].append(row)
        cub = f"{row['cublas_ms']:>9.4f}" if row["cublas_ms"] else f"{'-':>9}"
        print(f"{f'{M}x{N}x{K}':<20} {cub} " + " ".join(cells), flush=True)
        torch.cuda.empty_cache()

    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
        print(f"wrote {args.out}")
    assert not failures, "failed: " + "; ".join(failures)
    print("all results within tolerance")


if __name__ == "__main__":
    main()
