"""The ``overlap`` backend: Inductor's ``compile_fx`` with our pass pipeline as post-grad pass.

``OVERLAP_INDUCTOR=0`` swaps Inductor's codegen for running the (rewritten) ATen graph as is:
AOTAutograd with Inductor's decompositions and partitioner, our pipeline on each graph.
``OVERLAP_DISABLE=1`` is plain ``compile_fx``.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
from typing import Any

import torch
import torch.fx

from . import debug
from .config import OverlapConfig
from .passes import GraphReport, PassContext, build_manager

log = logging.getLogger("overlap_backend")

# The kind of graph Inductor is compiling right now; set around compile_fx_inner, read by the
# post-grad pass (Inductor does not tell post-grad passes whether a graph is a backward one).
_graph_kind: contextvars.ContextVar[str | None] = contextvars.ContextVar("overlap_graph_kind", default=None)
_graph_counter = itertools.count()

# Every graph report of this process, in compile order (tests and the demo read it).
REPORTS: list[GraphReport] = []


def _guess_kind(graph: torch.fx.Graph) -> str:
    names = [n.name for n in graph.nodes if n.op == "placeholder"]
    if any(n.startswith("tangents") for n in names):
        return "backward"
    return "forward" if names and all(n.startswith("primals") for n in names) else "inference"


def _cuda_graphs_on(config: OverlapConfig) -> bool:
    """Will Inductor replay this graph from a CUDA graph? Read while the pass runs, inside
    ``compile_fx``'s config patches (``mode="reduce-overhead"`` sets ``triton.cudagraphs``)."""
    if not config.inductor:
        return False
    from torch._inductor import config as inductor_config

    return bool(inductor_config.triton.cudagraphs)


def _graph_partitions_on() -> bool:
    """Does Inductor split this graph into partitions under CUDA graphs (``graph_partition``, on by
    default in torch 2.13; ``TORCHINDUCTOR_GRAPH_PARTITION``)? Then what it cannot capture (a
    data-dependent size, a CPU op, an unsafe op) runs between captured partitions instead of keeping
    the whole graph out, and the ops of a match are captured unless their own sizes are
    data-dependent (``PassContext.captured``)."""
    from torch._inductor import config as inductor_config

    return bool(getattr(inductor_config, "graph_partition", False))


def cudagraph_blocker(graph: torch.fx.Graph) -> str | None:
    """Why Inductor will not capture this graph even with cudagraphs on (None: it will, as far as
    the graph shows): the checks of ``torch._inductor.utils.get_first_incompatible_cudagraph_node``
    (a data-dependent size, e.g. dropless MoE's split sizes; an op tagged cudagraph-unsafe) and a
    tensor on the CPU (``check_multiple_devices_or_any_cpu_nodes``). Mutated inputs, the other
    reason, show only at run time: not seen here. Without graph partitions only (see
    :func:`_graph_partitions_on`)."""
    import torch._inductor.utils as inductor_utils
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    unsafe = getattr(inductor_utils, "is_cudagraph_unsafe_fx_node", lambda n: False)
    for n in graph.nodes:
        if unsafe(n):
            return f"{n.name}: an op that cannot be captured"
        val = n.meta.get("val")
        if val is None:
            continue
        if free_unbacked_symbols(val):
            return f"{n.name}: a data-dependent size"
        vals = val if isinstance(val, (list, tuple)) else [val]
        # a CPU scalar computed in the graph (lift_fresh_copy of a constant, e.g. the 0 that the
        # vocab-parallel embedding's masked index_put writes) is a constant to Inductor, not a CPU
        # buffer: the Llama TP+SP forward holding one was captured (0 cudagraph skips, torch 2.11)
        # while this check priced its ops eagerly. A CPU graph input with users, or a CPU output, is not.
        buffer = n.op == "placeholder" or any(u.op == "output" for u in n.users)
        if any(isinstance(v, torch.Tensor) and v.device.type == "cpu" and (v.dim() > 0 or buffer) for v in vals):
            return f"{n.name}: a CPU tensor"
    return None


class OverlapBackend:
    """A ``torch.compile`` backend callable bound to one :class:`OverlapConfig`."""

    def __init__(self, config: OverlapConfig):
        self.config = config
        self.manager = build_manager(config.passes, config)
        self.reports: list[GraphReport] = []

    # ------------------------------------------------------------------ the pipeline itself
    def run_pipeline(self, graph: torch.fx.Graph, kind: str | None = None) -> GraphReport:
        kind = kind or _graph_kind.get() or _guess_kind(graph)
        report = GraphReport(id=f"{next(_graph_counter):03d}_{kind}", kind=kind)
        dumper = debug.GraphDumper(self.config.debug_dir, report.id) if self.config.debug_dir else None
        graphs = _cuda_graphs_on(self.config)
        partitioned = graphs and _graph_partitions_on()
        ctx = PassContext(self.config, kind, cuda_graphs=graphs and (partitioned or not cudagraph_blocker(graph)),
                          partitioned=partitioned)
        self.manager.run(graph, ctx, report, observer=dumper)
        if dumper is not None:
            dumper.ops(graph, captured=ctx.cuda_graphs)
            dumper.finish()
        self.reports.append(report)
        REPORTS.append(report)
        debug.record(self.config.debug_dir, report)
        return report

    def _post_grad_pass(self, graph: torch.fx.Graph) -> None:
        self.run_pipeline(graph)

    # ------------------------------------------------------------------ backend entry point
    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any], mode: str | None = None,
                 options: dict | None = None):
        """``mode`` / ``options``: what ``torch.compile(mode=..., options=...)`` passes on; they mean what
        they mean for Inductor (e.g. ``mode="reduce-overhead"``: CUDA graphs)."""
        from torch._inductor import list_mode_options
        from torch._inductor.compile_fx import compile_fx

        patches = {**(list_mode_options(mode) if mode else {}), **(options or {})}
        if self.config.disable:  # plain Inductor: untouched, but for what mode/options ask
            return compile_fx(gm, example_inputs, **({"config_patches": patches} if patches else {}))
        # Our pass has side effects (reports, dumps) and is not keyed into Inductor's caches.
        with torch._functorch.config.patch(enable_autograd_cache=False):
            if not self.config.inductor:
                return self._compile_without_inductor(gm, example_inputs)
            return compile_fx(
                gm,
                example_inputs,
                inner_compile=_kind_tracking_inner_compile,
                config_patches={**patches, "post_grad_custom_post_pass": self._post_grad_pass, "fx_graph_cache": False},
            )

    def _compile_without_inductor(self, gm: torch.fx.GraphModule, example_inputs: list[Any]):
        from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
        from torch._dynamo.backends.common import aot_autograd
        from torch._inductor.decomposition import select_decomp_table

        def compiler(kind: str):
            def compile_graph(graph_module: torch.fx.GraphModule, inputs):
                self.run_pipeline(graph_module.graph, kind)
                graph_module.recompile()
                return make_boxed_func(graph_module.forward)

            return compile_graph

        return aot_autograd(
            fw_compiler=compiler("forward"),
            bw_compiler=compiler("backward"),
            inference_compiler=compiler("inference"),
            decompositions=select_decomp_table(),
            partition_fn=min_cut_rematerialization_partition,
        )(gm, example_inputs)


def _kind_tracking_inner_compile(gm, example_inputs, *args, **kwargs):
    from torch._inductor.compile_fx import compile_fx_inner

    if kwargs.get("is_backward"):
        kind = "backward"
    elif kwargs.get("is_inference"):
        kind = "inference"
    else:
        kind = "forward"
    token = _graph_kind.set(kind)
    try:
        return compile_fx_inner(gm, example_inputs, *args, **kwargs)
    finally:
        _graph_kind.reset(token)


def make_backend(config: OverlapConfig | None = None, **overrides: Any) -> OverlapBackend:
    """A backend for ``torch.compile(backend=...)``.

    ``config`` (explicit) or the ``OVERLAP_*`` environment, then ``overrides`` (e.g.
    ``passes=["ag_mm"], lowering="p2p"``) on top.
    """
    config = config.replace(**overrides) if config is not None else OverlapConfig.from_env(**overrides)
    return OverlapBackend(config)


def overlap(gm: torch.fx.GraphModule, example_inputs: list[Any], mode: str | None = None,
            options: dict | None = None):
    """The backend registered as ``"overlap"``: reads the environment at each compile; ``mode`` and
    ``options`` as ``torch.compile`` passes them (``mode="reduce-overhead"``: CUDA graphs)."""
    return make_backend()(gm, example_inputs, mode=mode, options=options)
