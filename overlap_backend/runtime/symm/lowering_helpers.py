"""What the symm lowering of every op shares (``ag_mm``, ``mm_rs``, ``mm_ar`` here; ``moe_experts`` and
``cta_pipeline_mlp`` in ``runtime/moe_symm.py`` and ``runtime/cta_symm.py``): the fallback to ``p2p``,
the decisions for calls captured in CUDA graphs, the kernels and their tuned block configs, the
operands as the kernels read them, and the GEMM and reduction steps of the cuBLAS paths.

Every fallback decision depends only on shapes, dtypes, the op's arguments and knobs, so it is the
same on every rank.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter

import torch
from torch import Tensor

from ...spec import knobs
from .. import cuda as _cuda
from ..lowering import implementation
from . import registry
from .group import GroupState

log = logging.getLogger("overlap_backend.symm")

DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # what the tile kernels compute in
_logged: set[tuple[str, str]] = set()
tuned_configs: dict[tuple, tuple] = {}  # (kernel, shape key) -> block config, without configs.pick's lookups
PATHS: Counter = Counter()  # "op:symm" / "op:p2p" calls of this process (tests check the path taken)
CAPTURE_WHY = ("inside a CUDA-graph capture (knobs.symm.CAPTURE_ON_SYMM is off); p2p's NCCL calls are "
               "captured")


def run_on_p2p(op: str, why: str | None, group_name: str, *args):
    """Run ``op`` on the p2p lowering; ``why`` None means the group's symm setup failed."""
    why = why or registry.fallback_reasons.get(group_name, "symmetric-memory setup failed")
    PATHS[f"{op}:p2p"] += 1
    if (op, why) not in _logged:
        _logged.add((op, why))
        log.info("overlap symm: %s runs on p2p: %s", op, why)
    return implementation("p2p", op)(*args)


# --------------------------------------------------------------------------- captured calls
_graph_protocol = [False]  # set by ``protocol``: this thread's symm calls use the captured-call protocol


@contextlib.contextmanager
def protocol(graph: bool):
    """Symm calls inside use the captured-call protocol (the toggling flag block) whether or not the
    stream is capturing: the private graphs' eager runs and captures (``private_graphs.py``)."""
    before = _graph_protocol[0]
    _graph_protocol[0] = graph
    try:
        yield
    finally:
        _graph_protocol[0] = before


def capturing(t: Tensor) -> bool:
    """The call uses the captured-call protocol: it is being captured, or runs under ``protocol(graph=True)``."""
    return t.is_cuda and (_graph_protocol[0] or torch.cuda.is_current_stream_capturing())


def eager_protocol_run(t: Tensor) -> bool:
    """The call runs on the captured-call protocol without being recorded into a graph (a private graph's
    eager run): it may do what only an eager call can (collectives, host-to-device copies it keeps)."""
    return _graph_protocol[0] and not (t.is_cuda and torch.cuda.is_current_stream_capturing())


def capture_problem(t: Tensor) -> str | None:
    """Why a call being captured into a CUDA graph cannot take the symm path (None: it can, or it is
    not being captured). Every rank of a group captures the same graph, so the decision is the same
    on every rank. The private graphs' calls (``protocol``) always can."""
    if _graph_protocol[0]:
        return None
    return CAPTURE_WHY if capturing(t) and not knobs.symm.CAPTURE_ON_SYMM else None


def call_state(group_name: str, device: torch.device, graph: bool) -> tuple[GroupState | None, str | None]:
    """The group's symm state, or (None, why not). A captured call only uses a state that eager
    calls set up before (setting one up is collective and synchronises); every rank made the same
    calls, so every rank decides alike."""
    if not graph:
        return registry.state(group_name, device), None
    st = registry.states.get((group_name, device.index))
    if st is None:
        return None, "captured before any eager symm call set the group up (warm up eagerly first)"
    return st, None


def compute_stream(st: GroupState, graph: bool):
    """The stream the call's compute runs on: the current stream, as a raw-handle object in an eager call
    of a group on the ctypes path (``GroupState.fast``), else as torch's ``Stream`` (a capture's
    ``torch.cuda.stream`` blocks need one)."""
    if st.fast and not graph:
        return _cuda.current_stream(st.device.index)
    return torch.cuda.current_stream(st.device)


def captured_call_problem(st: GroupState, nbytes: int, tuned: list) -> str | None:
    """Why a captured call cannot run on symm: its data buffer would have to grow (synchronising,
    collective) or a block config was never tuned (timing runs synchronise) in an eager call. A call
    that only uses the captured protocol without being captured (``protocol``) may do both."""
    if _graph_protocol[0] and not torch.cuda.is_current_stream_capturing():
        return None
    if st.data is None or st.data.nbytes < nbytes:
        return "inside a CUDA-graph capture the symm data buffer would have to grow (warm up eagerly first)"
    if None in tuned:
        return "inside a CUDA-graph capture with a shape no eager call tuned (warm up eagerly first)"
    return None


# ---------------------------------------------------------------------------------- kernels
def generated_epilogue(spec: str, dtype: torch.dtype):
    """The generated epilogue of ``spec`` (``codegen/epilogue.py``), or None when there is none or
    it cannot be generated: the caller then applies the reference (``spec/epilogue.py``)."""
    if not spec:
        return None
    from ...codegen import epilogue as gen

    try:
        return gen.build(spec, dtype)
    except gen.Unsupported as e:
        if ("epilogue", str(e)) not in _logged:
            _logged.add(("epilogue", str(e)))
            log.info("overlap symm: epilogue %r runs as separate torch ops: %s", spec, e)
        return None


def epilogue_pointers(g, args, outs=()):
    """The pointer arguments of the generated epilogue ``g`` (none without one)."""
    from ...codegen import epilogue as gen

    return gen.pointers(g, args, outs) if g is not None else ()


def tma_scratch(size: int, align: int, stream):
    """Triton's allocator for device-side TMA descriptors."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def load_kernels():
    """The kernel modules ``(ag_mm, mm_rs, reduce, configs)``, with Triton's allocator set."""
    global _kernels
    if _kernels is None:
        import triton

        from ...codegen import ag_mm, configs, mm_rs, reduce

        _kernels = (ag_mm, mm_rs, reduce, configs, triton.set_allocator)
    # Device-side TMA descriptors need a little global scratch per launch. Triton keeps its
    # allocator in a context variable, which autograd's backward thread does not inherit: set it
    # on every call (a context-variable write).
    _kernels[4](tma_scratch)
    return _kernels[:4]


_kernels = None  # load_kernels' modules, imported on first use (never on machines without Triton)


_preloaded: set = set()


def preload_once(key: tuple, launches) -> None:
    """``launches()`` inside ``launcher.preloading()`` the first time ``key`` is seen: ``key`` names the
    kernel variants of a call (its tile configs, epilogues, flag block and the 16-byte alignment of the
    operands that are not always aligned: ``aligned``), so a key seen before has nothing to load."""
    if key in _preloaded:
        return
    from ...codegen import launcher

    with launcher.preloading():
        launches()
    if len(_preloaded) >= knobs.symm.MAX_PLANS:
        _preloaded.clear()  # (a key seen again is preloaded again: its variant is found compiled)
    _preloaded.add(key)


def aligned(tensors) -> tuple:
    """Which of ``tensors`` (None allowed) start on a 16-byte boundary: part of a kernel variant's key."""
    return tuple([t is not None and t.data_ptr() % 16 == 0 for t in tensors])


def tune(kernel: str, key: tuple, cands, run) -> tuple:
    """Pick a block config by timing ``run(config)`` with every flag already raised (epoch 0)."""
    cfg = tuned_configs.get((kernel, key))
    if cfg is None:
        import triton.testing

        _, _, _, configs = load_kernels()
        cfg = configs.pick(kernel, key, cands, lambda c: triton.testing.do_bench(lambda: run(c), warmup=5, rep=20))
        tuned_configs[(kernel, key)] = cfg
    return cfg


# --------------------------------------------------------------------------------- operands
ZERO_CONTRACTION = 64  # columns of zeros that stand in for an empty contraction (a row of 128+ bytes: TMA-aligned)


def zero_contraction(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """``a`` [M, 0] @ ``b`` [0, N] as a contraction over zeros that the kernels take: the same product
    (all zeros), so ``+ bias`` and the reduction over ranks run as for any other GEMM."""
    return (a.new_zeros((a.shape[0], ZERO_CONTRACTION)), b.new_zeros((ZERO_CONTRACTION, b.shape[1])))


def tma_aligned(t: Tensor) -> Tensor:
    """Contiguous, 16-byte aligned (TMA needs both)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def kernel_weight(b: Tensor) -> Tensor:
    """``b`` [K, N] as the kernels read it: row-major, or the transpose of a row-major [N, K]."""
    kmajor = b.stride(0) == 1 and b.stride(1) == b.shape[0]
    if not (kmajor or b.is_contiguous()) or b.data_ptr() % 16:
        b = b.contiguous()
        if b.data_ptr() % 16:
            b = b.clone()
    return b


def tma_problem(dtype: torch.dtype, *inner_dims: int) -> str | None:
    """Why tensors of ``dtype`` with these innermost dimensions cannot be TMA operands (None: they can)."""
    if dtype not in DTYPES:
        return f"dtype {dtype} (kernels: {', '.join(map(str, DTYPES))})"
    es = dtype.itemsize
    for d in inner_dims:
        if (d * es) % 16:
            return f"a row of {d} {dtype} elements is not a multiple of 16 bytes (TMA)"
    return None


# ----------------------------------------------------------------------- cuBLAS-path steps
def peer_slot_ranges(rank: int, ws: int) -> list[tuple[int, int]]:
    """The peers' slots as contiguous ``[lo, hi)`` ranges, those after ``rank`` first (the order chunks arrive
    and are shipped in), then those before it; empty ranges left out."""
    return [(lo, hi) for lo, hi in ((rank + 1, ws), (0, rank)) if hi > lo]


def matmul_into(a, b, bias, out) -> None:
    """``out = a @ b (+ bias)`` on cuBLAS."""
    if bias is None:
        torch.mm(a, b, out=out)
    else:
        torch.addmm(bias, a, b, out=out)


def reduce_slots(slots, out, row0, n, average, epilogue=None, ep_ptrs=()) -> None:
    """``out[row0 : row0 + n]`` = the sum (``average``: mean) of the ranks' partials of those rows
    in ``slots`` [ws, rows, N] (rows numbered as the op's output), summed in float32 and rounded
    once; with the generated ``epilogue`` applied in the same kernel."""
    if not n:
        return
    if epilogue is None:
        (torch.mean if average else torch.sum)(slots[:, row0 : row0 + n], dim=0, out=out[row0 : row0 + n])
        return
    from ...codegen import epilogue as gen

    gen.apply_reduce(epilogue, slots, out, row0, n, 1.0 / slots.shape[0] if average else 1.0, ep_ptrs)


def wait_on_push_streams(st: GroupState, word: int, epoch: int, nbands: int = 1) -> None:
    """Every stream this call pushes to its peers on waits for this rank's flag ``word`` >= ``epoch``
    (one stream wait per distinct stream)."""
    for stream in {id(s): s for s in (st.push_stream_to(p) for p in range(st.ws) if p != st.rank)}.values():
        st.stream_wait(word, epoch, stream, nbands)
