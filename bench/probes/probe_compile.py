"""Probe: compile an op kernel for a GPU architecture on any machine, no GPU needed, and report how Triton built
it (explains a kernel's speed before a device call; not a test).

    python bench/probes/probe_compile.py ag_mm [--set FLATTEN=True] [--set WS=8 ...] [--arch 90] [--warps 8]
        [--stages 3] [--epilogue bias:0,gelu] [--out DIR] [--json]

Kernels: ``ag_mm`` (``codegen/ag_mm.py``'s consumer; ``ag_mm_whole``: its kernel at decode sizes; ``ag_mm_ws``:
its warp-specialized Gluon kernel, ``codegen/ag_mm_ws.py``, 4 warps and its own register budgets whatever
``--warps``), ``mm_rs`` (``codegen/mm_rs.py``'s producer), ``moe_down``
(``codegen/moe_gemm.py``'s down kernel), ``cta_stage0`` / ``cta_stage1`` (``codegen/cta.py``'s stages) and
``cta_split_sum`` / ``cta_split_sum0`` (stage 1's / stage 0's split tiles' sum after it), bf16, with
the constexprs below unless ``--set NAME=VALUE`` (a Python literal) overrides one. Prints the shared memory the
kernel needs and, in its TTGIR, the loops (``scf.for`` / ``scf.while``), the TMA loads, the barrier waits, the
wgmma ops, the multi-buffered shared allocations (``2x``, ``3x`` ...: loads in flight) and the worker partitions of
a warp-specialized kernel; then what Triton's ptxas
reports of its PTX: registers, spills and performance warnings; ``--out`` also writes the TTGIR and PTX. Which
loads a loop issues ahead, and whether a wait sits between a load and its use, shows there:
e.g. mm_rs's own tiles loaded the peers' partials one at a time (a barrier wait after each), the flattened ag_mm
loop keeps each tile's flag wait before its loads.

Use the Triton of the GPU machines to see what they compile (``pip install triton==3.6.0`` in a separate venv);
the probe turns the interpreter off for itself (kernels decorated under ``TRITON_INTERPRET=1`` cannot compile).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # before the kernels are decorated
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from overlap_backend.spec import knobs  # noqa: E402

# per kernel: its constexprs (defaults), its bf16 pointers, its int32 pointers (float32 ones: fp32, peer address tables:
# tables), its 64-bit integers, and the integers
# taken to be multiples of 16, as Triton's launcher specializes sizes that are (the stores' vector width follows)
KERNELS = {
    "ag_mm": dict(
        const=dict(WS=4, BM=128, BN=256, BK=64, GROUP_M=8, B_KMAJOR=True, HAS_BIAS=False, PRECISION=None, TIMED=True,
                   TMA_STORE=True, SUBTILE=False, WARP_SPEC=False, FLATTEN=False, PEERS_BY_COLUMN=False),
        data={"shard_ptr", "buf_ptr", "b_ptr", "bias_ptr", "out_ptr", "ep0", "ep1", "ep2", "ep3"},
        flags={"flags_ptr", "claim_ptr", "report_ptr"}, wide={"timeout_ns"},
        sizes={"rows", "run", "N", "K", "band_rows"}),
    "ag_mm_whole": dict(
        const=dict(WS=8, BM=128, BN=256, BK=64, GROUP_M=8, B_KMAJOR=True, HAS_BIAS=False, PRECISION=None, TIMED=True,
                   TMA_STORE=True, SUBTILE=False, WARP_SPEC=False, FLATTEN=False, INTERPRET=False),
        data={"buf_ptr", "b_ptr", "bias_ptr", "out_ptr", "ep0", "ep1", "ep2", "ep3"},
        flags={"flags_ptr", "claim_ptr", "report_ptr"}, wide={"timeout_ns"}, sizes={"rows", "run", "N", "K"}),
    "ag_mm_ws": dict(  # a Gluon kernel: 4 warps (the default partition), the register budgets of gluon_ring
        const=dict(WS=4, BM=128, BN=128, BK=64, GROUP_M=8, STAGES=4, B_KMAJOR=True, HAS_BIAS=False, TIMED=True,
                   PEERS_BY_COLUMN=False, COOP=False, EP_VALUES=0),
        data={"shard_ptr", "buf_ptr", "b_ptr", "bias_ptr", "out_ptr", "ep0", "ep1", "ep2", "ep3"},
        flags={"flags_ptr", "claim_ptr", "report_ptr"}, wide={"timeout_ns"}, sizes={"rows", "N", "K", "band_rows"}),
    "mm_rs_ws": dict(  # a Gluon kernel, as ag_mm_ws (--set WRITE_GATHER=True: mm_ar's rounds; --set COOP=True
        # --set BN=256 --set STAGES=3: ws_coop), the op's epilogue values a thread
        const=dict(WS=4, BM=128, BN=128, BK=64, GROUP_M=8, STAGES=4, B_KMAJOR=True, HAS_BIAS=False, AVERAGE=False,
                   TIMED=True, EP_VALUES=knobs.codegen.GLUON_EPILOGUE_VALUES, DIRECT=False, WRITE_GATHER=False,
                   COOP=False),
        data={"a_ptr", "b_ptr", "bias_ptr", "stage_ptr", "recv_ptr", "gather_ptr", "out_ptr", "ep0", "ep1", "ep2",
              "ep3"},
        flags={"counters_ptr", "done_ptr", "recv_flags_ptr", "ticket_ptr", "claim_ptr", "report_ptr"},
        wide={"timeout_ns"}, sizes={"M", "rows", "N", "K", "out_round_stride", "out_rows", "band_rows"}),
    "mm_rs": dict(
        const=dict(WS=4, BM=128, BN=256, BK=64, GROUP_M=8, B_KMAJOR=True, HAS_BIAS=False, AVERAGE=False,
                   WRITE_GATHER=False, PRECISION=None, TIMED=True, PEER_STORE=False, TMA=True, INTERPRET=False,
                   COPY_OUT=False, SUBTILE=False, PARTIAL_STAGES=1, SPAN=1),
        data={"a_ptr", "b_ptr", "bias_ptr", "stage_ptr", "recv_ptr", "gather_ptr", "out_ptr", "ep0", "ep1", "ep2", "ep3"},
        flags={"counters_ptr", "done_ptr", "recv_flags_ptr", "tile_ticket_ptr", "gathered_ptr", "claim_ptr",
               "report_ptr", "ready_ptr"}, tables={"peer_data_ptr", "peer_flags_ptr"}, wide={"timeout_ns"},
        sizes={"M", "N", "K", "rows", "run", "out_round_stride", "out_rows", "band_rows"}),
    "moe_down": dict(
        const=dict(WS=4, LOG_G=5, BM=128, BN=256, BK=64, GROUP_M=16, EXPERT_MAJOR=False, WD_K_MAJOR=False,
                   TMA_STORE=True, INTERPRET=False, SPAN=False),
        data={"act_ptr", "w_down_ptr", "out_ptr", "stage_ptr"},
        flags={"srows_ptr", "counts_ptr", "row_start_ptr", "tile_start_ptr", "recv_off_ptr", "src_tiles_ptr",
               "counters_ptr", "done_ptr", "contig_ptr"}, wide=set(), sizes={"M", "H", "F", "wd_stride_e", "wd_stride_row"}),
    "moe_gate_up": dict(
        const=dict(WS=4, LOG_G=5, BM=64, BN=256, BK=64, GROUP_M=8, EXPERT_MAJOR=True, TIMED=True, WG_K_MAJOR=False,
                   WU_K_MAJOR=False, SPAN=False),
        data={"disp_ptr", "w_gate_ptr", "w_up_ptr", "act_ptr"},
        flags={"srows_ptr", "counts_ptr", "row_start_ptr", "tile_start_ptr", "recv_off_ptr", "contig_ptr", "arrived_ptr",
               "caps_ptr", "claim_ptr", "report_ptr"}, wide={"timeout_ns"},
        sizes={"cap", "H", "F", "wg_stride_e", "wg_stride_row", "wu_stride_e", "wu_stride_row"}),
    "moe_down_ws": dict(  # a Gluon kernel, as ag_mm_ws (ws_pingpong; --set COOP=True --set BN=256 --set STAGES=3: ws_coop)
        const=dict(WS=4, LOG_G=5, BM=128, BN=128, BK=64, GROUP_M=16, STAGES=4, EXPERT_MAJOR=False, B_KMAJOR=False,
                   COOP=False),
        data={"act_ptr", "w_ptr", "out_ptr", "stage_ptr"},
        flags={"srows_ptr", "counts_ptr", "row_start_ptr", "tile_start_ptr", "recv_off_ptr", "src_tiles_ptr",
               "counters_ptr", "done_ptr", "contig_ptr"}, wide=set(), sizes={"M", "H", "F"}),
    "cta_stage0_ws": dict(  # a Gluon kernel, as ag_mm_ws (ws_pingpong; --set COOP=True --set BN=256 --set STAGES=3: ws_coop)
        const=dict(EP_VALUES=knobs.codegen.GLUON_EPILOGUE_VALUES, TP=1, BM=128, BN=128, BK=64, GROUP_M=8, STAGES=4, COOP=False, WAIT_READY=False,
                   TIMED=True, COUNT_FIRST_AT_ONCE=True),
        data={"x_ptr", "w1_ptr", "stage_ptr", "keep_ptr", "ep0", "ep1", "ep2", "ep3"},
        flags={"counters_ptr", "done_ptr", "epoch_ptr", "ready_ptr", "claim_ptr", "report_ptr"}, wide={"timeout_ns"},
        sizes={"M", "Mp", "H", "Fp", "ldw", "Fship", "kchunk"}),
    "cta_stage1": dict(
        const=dict(WS=8, TP=4, BM=128, BN=256, BK=64, GROUP_M=16, HAS_B2=False, WAIT_READY=False, PRECISION=None,
                   TIMED=True, INTERPRET=False, HAS_TAIL=False, SHIP_BEFORE_TAIL=False, SPLIT_K=False,
                   READY_RUNS=True, SUM_PAIRS=False, SPLIT_FIXUP=False),
        data={"a_ptr", "w2_ptr", "out_ptr", "part_ptr"}, fp32={"b2_ptr", "split_ptr"},
        tables={"peer_data_ptr", "peer_flags_ptr"},
        flags={"a_flags_ptr", "counters_ptr", "epoch_ptr", "ready_ptr", "claim_ptr", "report_ptr", "tail_flags_ptr",
               "split_counters_ptr"},
        wide={"timeout_ns", "y_offset"}, sizes={"Mp", "Fp", "Fship", "F1", "N", "Ns", "kchunk"}),
    "cta_stage0": dict(  # codegen/cta.py's stage 0 (ACT: 0 erf GELU, 1 tanh GELU, 2 SwiGLU: two accumulators)
        const=dict(TP=4, BM=128, BN=256, BK=64, GROUP_M=16, ACT=0, HAS_B1=True, HAS_B3=False, STAGED=True,
                   WAIT_READY=False, PRECISION=None, TIMED=True, COUNT_FIRST_AT_ONCE=False, TMA_STORE=True,
                   INTERPRET=False, SPLIT_LAST=False, SPLIT_K=False, SUM_PAIRS=False, SPLIT_FIXUP=False,
                   STREAM_K=False),
        data={"x_ptr", "w1_ptr", "w3_ptr", "stage_ptr", "keep_ptr"}, fp32={"b1_ptr", "b3_ptr", "split_ptr"},
        tables={"peer_data_ptr", "peer_flags_ptr"},
        flags={"counters_ptr", "done_ptr", "epoch_ptr", "ready_ptr", "claim_ptr", "report_ptr", "split_counters_ptr"},
        wide={"timeout_ns"}, sizes={"Mp", "H", "Fp", "ldw", "Fship", "kchunk"}),
    "cta_split_sum": dict(  # codegen/cta.py's stage1_split_sum_kernel (knobs.cta.STAGE1_SPLIT_FIXUP)
        const=dict(WS=8, TP=4, BM=128, BN=128, GROUP_M=16, ROWS=16, HAS_B2=False, TIMED=True, HAS_TAIL=False,
                   SHIP_BEFORE_TAIL=False),
        data={"out_ptr", "part_ptr"}, fp32={"b2_ptr", "split_ptr"}, tables={"peer_data_ptr", "peer_flags_ptr"},
        flags={"counters_ptr", "epoch_ptr", "claim_ptr", "report_ptr", "tail_flags_ptr"},
        wide={"timeout_ns", "y_offset"}, sizes={"N", "Ns", "Fp", "Fship", "kchunk"}),
    "cta_split_sum0": dict(  # codegen/cta.py's stage0_split_sum_kernel (knobs.cta.STAGE0_SPLIT_FIXUP)
        const=dict(TP=4, BM=128, BN=256, GROUP_M=16, ROWS=4, ACT=1, HAS_B1=False, HAS_B3=False, STAGED=True,
                   STREAM_K=False),
        data={"x_ptr", "stage_ptr", "keep_ptr"}, fp32={"b1_ptr", "b3_ptr", "split_ptr"},
        tables={"peer_data_ptr", "peer_flags_ptr"}, flags={"counters_ptr", "done_ptr", "epoch_ptr"}, wide=set(),
        sizes={"Mp", "Fp", "Fship", "kchunk"}),
}
# the Gluon kernels: (module of overlap_backend.codegen, kernel); 4 warps and gluon_ring's register budgets
GLUON_KERNELS = {"ag_mm_ws": ("ag_mm_ws", "ag_mm_ws_kernel"), "mm_rs_ws": ("mm_rs_ws", "mm_rs_ws_kernel"),
                 "moe_down_ws": ("moe_down_ws", "down_ws_kernel"), "cta_stage0_ws": ("cta_ws", "stage0_ws_kernel")}
COUNTS = {"scf.for": r"scf\.for ", "scf.while": r"scf\.while ", "TMA loads": r"async_tma_copy_global_to_local",
          "barrier waits": r"ttng\.wait_barrier", "wgmma": r"ttng\.warp_group_dot ", "TMA stores": r"async_tma_copy_local_to_global",
          "multi-buffered shared": r"local_alloc : \(\) -> !ttg\.memdesc<[2-9]x",
          "worker partitions": r"\bpartition\d+\(",
          # a descriptor made before the partitions and used in a worker one: its TMA copies may read a stale
          # descriptor (gluon_ring.partition_descriptor)
          "worker partitions handed a TMA descriptor": r"\bpartition\d+\([^\n]*!tt\.tensordesc"}


def compile_kernel(name: str, overrides: dict, arch: int = 90, warps: int = 8, stages: int = 3, epilogue: str = ""):
    """The compiled kernel (``triton.compile``) of ``name`` with its constexprs overridden by ``overrides`` and, for a
    kernel that takes one, the generated epilogue of spec ``epilogue`` (``codegen/epilogue.py``; "": none)."""
    from overlap_backend.codegen import ag_mm, cta, mm_rs, moe_gemm
    from overlap_backend.codegen.epilogue import build, epilogue_fn

    spec = KERNELS[name]
    unknown = set(overrides) - set(spec["const"])
    if unknown:
        raise SystemExit(f"{name} has no constexpr {sorted(unknown)}; its constexprs: {sorted(spec['const'])}")
    const = {**spec["const"], **overrides}
    source, options = ASTSource, {"num_warps": warps, "num_stages": stages}
    if name in GLUON_KERNELS:
        from triton.experimental.gluon._runtime import GluonASTSource

        from overlap_backend.codegen import gluon_ring

        module_name, kernel_name = GLUON_KERNELS[name]
        fn = getattr(importlib.import_module(f"overlap_backend.codegen.{module_name}"), kernel_name)
        const.update(MMA_REGS=gluon_ring.MMA_REGS, LOAD_REGS=gluon_ring.LOAD_REGS)
        if name == "mm_rs_ws":
            const["IDENTITY"] = epilogue_fn(None, (), torch.bfloat16, torch.empty(1))[0]
        source, options = GluonASTSource, {"num_warps": gluon_ring.WARPS, "maxnreg": gluon_ring.MAXNREG}
    else:
        fn = {"ag_mm": ag_mm.ag_mm_kernel, "ag_mm_whole": ag_mm.ag_mm_whole_kernel, "mm_rs": mm_rs.mm_rs_kernel,
              "moe_down": moe_gemm.down_kernel, "moe_gate_up": moe_gemm.gate_up_kernel, "cta_stage0": cta.stage0_kernel, "cta_stage1": cta.stage1_kernel,
              "cta_split_sum": cta.stage1_split_sum_kernel, "cta_split_sum0": cta.stage0_split_sum_kernel}[name]
    names = fn.arg_names
    if "EPILOGUE" in names:
        const["EPILOGUE"] = epilogue_fn(build(epilogue, torch.bfloat16) if epilogue else None, (), torch.bfloat16,
                                        torch.empty(1))[0]
    elif epilogue:
        raise SystemExit(f"{name} takes no generated epilogue")
    sig = {}
    for n in names:
        if n in const:
            sig[n] = "constexpr"
        elif n in spec["data"]:
            sig[n] = "*bf16"
        elif n in spec["flags"]:
            sig[n] = "*i32"
        elif n in spec.get("fp32", ()):
            sig[n] = "*fp32"
        elif n in spec.get("tables", ()):
            sig[n] = "*i64"
        else:
            sig[n] = "i64" if n in spec["wide"] else "i32"
    pointers = spec["data"] | spec["flags"] | spec.get("fp32", set()) | spec.get("tables", set())
    src = source(fn, sig, constexprs={(names.index(n),): v for n, v in const.items()},
                 attrs={(names.index(n),): [["tt.divisibility", 16]] for n in names
                        if n in pointers or n in spec["sizes"]})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def report(compiled, arch: int = 90) -> dict:
    ttgir = compiled.asm["ttgir"]
    return {"triton": triton.__version__, "shared_bytes": compiled.metadata.shared,
            **{k: len(re.findall(p, ttgir)) for k, p in COUNTS.items()}, **tma_store_order(compiled.asm["ptx"]),
            # a tile stored 2 bytes at a time: a pointer whose alignment Triton cannot see (tiles.peer_buffer)
            "16-bit scalar global stores": len(re.findall(r"\bst\.global\.b16\b", compiled.asm["ptx"])),
            **ptxas_report(compiled.asm["ptx"], arch)}


def tma_store_order(ptx: str) -> dict:
    """How the PTX's TMA stores (shared -> global) follow the threads' writes to shared memory: the writers' proxy
    fence, then the barrier, then the store is right; a barrier then the fences lets a warp's store read another
    warp's writes before that warp's fence (stale data)."""
    fenced, unfenced = 0, 0
    last_fence = last_barrier = -1
    for i, line in enumerate(ptx.splitlines()):
        if "fence.proxy.async.shared" in line:
            last_fence = i
        elif re.search(r"\b(bar|barrier)\.sync\b", line):
            last_barrier = i
        elif "cp.async.bulk.tensor" in line and "global.shared" in line:
            if 0 <= last_fence < last_barrier:
                fenced += 1
            else:
                unfenced += 1
    return {"TMA stores fenced, then synchronized": fenced, "TMA stores not fenced before the barrier": unfenced}


def ptxas_report(ptx: str, arch: int) -> dict:
    """What Triton's ptxas says of the kernel (``-v``): registers per thread, bytes spilled, and its performance
    warnings (e.g. C7515: wgmma ops serialized; C7517: a warpgroup.wait injected) — a kernel that spills or whose
    wgmma ops are serialized loses far more than its tile loop's structure can win."""
    from triton.backends.nvidia.compiler import get_ptxas

    try:
        ptxas = Path(get_ptxas(arch).path)  # the one Triton compiles this architecture with
    except Exception as e:  # noqa: BLE001 - a report, not a failure
        return {"ptxas": f"not found: {e}"}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx)
        run = subprocess.run([str(ptxas), f"-arch=sm_{arch}{'a' if arch >= 90 else ''}", "-v", str(src), "-o",
                              str(Path(tmp) / "kernel.cubin")], capture_output=True, text=True)
        sass = sass_instructions(ptxas.parent / "cuobjdump", Path(tmp) / "kernel.cubin") if not run.returncode else None
    log = run.stdout + run.stderr
    if run.returncode:
        return {"ptxas": f"failed: {log.strip()[-300:]}"}
    found = lambda pattern: int(m.group(1)) if (m := re.search(pattern, log)) else None  # noqa: E731
    return {"registers": found(r"Used (\d+) registers"), "spill stores (bytes)": found(r"(\d+) bytes spill stores"),
            "spill loads (bytes)": found(r"(\d+) bytes spill loads"), "SASS instructions": sass,
            "ptxas warnings": sorted(set(re.findall(r"\((C\d+)\) ([^.]*)", log)))}


def sass_instructions(cuobjdump: Path, cubin: Path) -> int | None:
    """Instructions in the kernel's SASS: straight-line code much larger than the instruction cache (an unrolled
    epilogue of a persistent kernel) is fetched again on every tile, and stalls warps on instruction fetch."""
    if not cuobjdump.exists():
        return None
    run = subprocess.run([str(cuobjdump), "-sass", str(cubin)], capture_output=True, text=True)
    return len(re.findall(r"/\*[0-9a-f]{4,}\*/", run.stdout)) if not run.returncode else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("kernel", choices=sorted(KERNELS))
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a constexpr (Python literal)")
    p.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 (Hopper)")
    p.add_argument("--warps", type=int, default=8)
    p.add_argument("--stages", type=int, default=3)
    p.add_argument("--epilogue", default="", help="a generated epilogue's spec, e.g. bias:0,gelu (kernels taking one)")
    p.add_argument("--out", type=Path, help="write <kernel>.ttgir and <kernel>.ptx here")
    p.add_argument("--json", action="store_true", help="print the report as one JSON line")
    args = p.parse_args(argv)
    overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")
        overrides[key] = ast.literal_eval(value)
    compiled = compile_kernel(args.kernel, overrides, args.arch, args.warps, args.stages, args.epilogue)
    rep = report(compiled, args.arch)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.kernel}.ttgir").write_text(compiled.asm["ttgir"])
        (args.out / f"{args.kernel}.ptx").write_text(compiled.asm["ptx"])
    print(json.dumps(rep) if args.json else "\n".join(f"{k}: {v}" for k, v in rep.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
