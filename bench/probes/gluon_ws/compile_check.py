"""Compile every ws_gemm variant/config for sm_90a on a machine without a GPU and report how it built.

Runs under Triton 3.6 (the GPU machines', e.g. in a separate venv) and 3.9 (torch 2.13's).

    python bench/probes/gluon_ws/compile_check.py [--configs pingpong:128x128x64:8:4,...] [--out DIR]

How: ``GluonASTSource`` (triton/experimental/gluon/_runtime.py) is ASTSource with language=GLUON, so
``triton.compile(GluonASTSource(fn, signature, constexprs), target=GPUTarget("cuda", 90, 32), options=...)`` runs the
whole pipeline (TTGIR -> PTX -> cubin via the bundled ptxas). A tensor-descriptor argument's signature string is what
the JIT would specialise it to: ``triton.runtime.jit.mangle_type`` of a gluon ``TensorDescriptor`` (built here on CPU
tensors), i.e. ``tensordesc<bf16[BM, BK],NVMMASharedLayout(...)>``.

Per config: shared memory bytes (and whether it fits Hopper's 227 KiB per block), registers at entry and the
setmaxnreg budgets per partition, spills (ptxas -v on the PTX), and the partitions: ``ttg.warp_specialize`` and its
partition regions in TTGIR, SETMAXNREG / HGMMA / TMA load+store in SASS. Exits non-zero if anything fails.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402
from triton.runtime.jit import mangle_type  # noqa: E402

import ws_gemm as W  # noqa: E402

sys.path.insert(0, str(HERE.parent))
from probe_compile import ptxas_report  # noqa: E402

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
SMEM_LIMIT = 232448  # 227 KiB: the most dynamic shared memory one block may opt into on sm_90

# (config spec, B layout): the defaults, the alternates worth timing, and the K-major B path of each variant
CHECKS = [
    ("coop", False), ("coop", True),
    ("coop:128x128x64:8:5", False),
    ("pingpong", False), ("pingpong", True),
    ("pingpong:128x128x64:8:5", False),
    ("pingpong:64x256x64:8:4", False),
    ("coop1", False), ("coop1", True),
]


def compile_config(config, b_kmajor, M=4096, N=4096, K=4096):
    """triton.compile of ws_gemm_kernel for one config, as the JIT would specialise it (sizes are runtime i32s)."""
    a = torch.empty(M, K, dtype=torch.bfloat16)
    b = torch.empty(N, K, dtype=torch.bfloat16).t() if b_kmajor else torch.empty(K, N, dtype=torch.bfloat16)
    c = torch.empty(M, N, dtype=torch.bfloat16)
    descs, kmajor = W.make_descs(a, b, c, config)
    assert kmajor == b_kmajor
    const, opts = W.kernel_params(config)
    const["B_KMAJOR"] = kmajor
    fn = W.ws_gemm_kernel
    names = fn.arg_names
    desc_of = dict(zip(("a_desc", "b_desc", "c_desc"), descs))
    sig = {n: "constexpr" if n in const else mangle_type(desc_of[n]) if n in desc_of else "i32" for n in names}
    src = GluonASTSource(fn, sig, constexprs={(names.index(n), ): v for n, v in const.items()}, attrs={})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)


def report(kernel, tmp):
    """What the compiled kernel shows: shared bytes, registers, spills, partitions, instructions."""
    cubin = Path(tmp) / "k.cubin"
    cubin.write_bytes(kernel.asm["cubin"])
    usage = subprocess.run([str(BIN / "cuobjdump"), "--dump-resource-usage", str(cubin)], capture_output=True,
                           text=True, check=True).stdout
    sass = subprocess.run([str(BIN / "cuobjdump"), "--dump-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    ptxas = ptxas_report(kernel.asm["ptx"], 90)
    ttgir = kernel.asm["ttgir"]
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    local = int(re.search(r"LOCAL:(\d+)", usage).group(1))
    ws = re.search(r"ttg\.warp_specialize\(.*requestedRegisters = array<i32: ([0-9, ]+)>", ttgir)
    parts = re.findall(r"^\s*partition(\d+)\(.*\) num_warps\((\d+)\)", ttgir, re.M)
    return dict(
        shared=kernel.metadata.shared, fits=kernel.metadata.shared <= SMEM_LIMIT, num_warps=kernel.metadata.num_warps,
        regs=regs, local=local, spill_st=ptxas.get("spill stores (bytes)", -1),
        spill_ld=ptxas.get("spill loads (bytes)", -1),
        setmaxnreg=sorted(set(int(x) for x in re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+)",
                                                              kernel.asm["ptx"]))),
        requested=ws.group(1) if ws else None, partitions=[f"p{p}:{w}w" for p, w in parts],
        hgmma=len(re.findall(r"\bHGMMA\.", sass)), setmaxreg_sass=len(re.findall(r"USETMAXREG", sass)),
        tma_ld=len(re.findall(r"UTMALDG", sass)), tma_st=len(re.findall(r"UTMASTG", sass)),
        hgmma_shape=sorted(set(re.findall(r"HGMMA\.(\d+x\d+x\d+)", sass))),
        warnings=ptxas.get("ptxas warnings", [ptxas.get("ptxas")]), sass=sass,
        tma_boxes=[m["block_size"] for m in (kernel.metadata.tensordesc_meta or [])],
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", help="comma list of variant[:BMxBNxBK:GROUP_M:STAGES], each with B [K,N] and K-major")
    ap.add_argument("--out", help="also write each kernel's TTGIR, PTX and SASS here")
    args = ap.parse_args()
    checks = CHECKS if not args.configs else [(c, km) for c in args.configs.split(",") for km in (False, True)]
    failed = 0
    print(f"triton {triton.__version__}, target sm_90a; ptxas {BIN / 'ptxas'}")
    hdr = (f"{'config':<26} {'B':<6} {'warps':>5} {'shared':>7} {'fits':>4} {'regs':>4} {'spill':>7} "
           f"{'setmaxnreg':<16} {'partitions':<16} {'HGMMA':>5} {'shape':<11} {'TMA ld/st':>9}")
    print(hdr)
    print("-" * len(hdr))
    for spec, b_kmajor in checks:
        config = W.parse_config(spec)
        name = W.config_name(config)
        try:
            kernel = compile_config(config, b_kmajor)
            with tempfile.TemporaryDirectory() as tmp:
                r = report(kernel, tmp)
        except Exception as e:  # report and go on: one config failing must not hide the others
            failed += 1
            msg = str(e).strip().splitlines()
            print(f"{name:<26} {'KxN' if not b_kmajor else 'NxK^T':<6} FAILED: {msg[-1] if msg else type(e).__name__}")
            continue
        ok = (r["fits"] and r["spill_st"] == 0 and r["spill_ld"] == 0 and r["local"] == 0 and r["requested"]
              and r["hgmma"] > 0 and r["setmaxreg_sass"] > 0 and r["tma_ld"] > 0 and r["tma_st"] > 0)
        failed += not ok
        print(f"{name:<26} {'KxN' if not b_kmajor else 'NxK^T':<6} {r['num_warps']:>5} {r['shared']:>7} "
              f"{'yes' if r['fits'] else 'NO':>4} {r['regs']:>4} {r['spill_st']:>3}/{r['spill_ld']:<3} "
              f"{','.join(map(str, r['setmaxnreg'])):<16} {' '.join(r['partitions']):<16} {r['hgmma']:>5} "
              f"{','.join(r['hgmma_shape']):<11} {r['tma_ld']:>4}/{r['tma_st']:<4}"
              f"{'' if ok else '  <-- CHECK'}")
        print(f"{'':<33}warp_specialize requestedRegisters=[{r['requested']}] (workers; default partition: the "
              f"rest of maxnreg), TMA boxes {r['tma_boxes']}")
        for w in r["warnings"]:
            print(f"{'':<33}ptxas: {w}")
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            stem = name.replace(":", "_") + ("_kmajor" if b_kmajor else "")
            (out / f"{stem}.ttgir").write_text(kernel.asm["ttgir"])
            (out / f"{stem}.ptx").write_text(kernel.asm["ptx"])
            (out / f"{stem}.sass").write_text(r["sass"])
    print()
    print("columns: shared = bytes of shared memory (fits: <= 227 KiB); regs = per-thread registers at kernel entry "
          "(maxnreg); spill = ptxas spill stores/loads (bytes); setmaxnreg = the per-warpgroup budgets the PTX sets; "
          "partitions = TTGIR worker partitions (the default partition runs num_warps=4); HGMMA = wgmma "
          "instructions in SASS")
    if failed:
        print(f"{failed} config(s) failed or need a look")
        sys.exit(1)
    print("all configs compiled clean")


if __name__ == "__main__":
    main()
