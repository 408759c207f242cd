"""The ``overlap`` backend: Inductor's ``compile_fx`` with our pass pipeline as post-grad pass.

``OVERLAP_INDUCTOR=0`` swaps Inductor's codegen for running the (rewritten) ATen graph as is:
AOTAutograd with Inductor's decompositions and partitioner, our pipeline on each graph.
``OVERLAP_DISABLE=1`` is plain ``compile_fx``.

Inductor's FX-graph and AOT-autograd caches stay on: the pipeline is a ``CustomGraphPass`` whose
``uuid()`` (:func:`pipeline_key`) covers everything its rewrite depends on besides the graph (the
config, the knobs, the calibration and facts of each process group of the graph, the package's
source). A graph served from those caches skips the pass; its reports are replayed from a small
store written when it was compiled (:class:`ReportStore`), so ``REPORTS``, ``backend.reports`` and
the log read the same on a warm start. With ``OVERLAP_DEBUG_DIR`` set the caches are off for the
compile, so every graph's dumps are written.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import hashlib
import itertools
import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
import torch.fx

from . import debug, rank_config
from .config import OverlapConfig
from .graph_breaks import GraphBreakTracker, split_pattern_records
from .passes import GraphReport, MatchRecord, PassContext, build_manager

try:  # Inductor's interface for post-grad passes that take part in its cache keys
    from torch._inductor.custom_graph_pass import CustomGraphPass
except ImportError:  # pragma: no cover - a torch without it compiles with the caches off
    CustomGraphPass = None

log = logging.getLogger("overlap_backend")

# The name of the package's loggers in ``TORCH_LOGS`` / ``torch._logging.set_logs`` (torch already
# has an artifact called ``overlap``: Inductor's own compute/communication overlap decisions).
TORCH_LOGS_NAME = "overlap_backend"
# The words of a match's decision, as ``summary.json`` writes them (MatchRecord.to_json's keys).
DECISION_KEYS = ("pass", "applied", "lowering", "nodes", "reason")

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


# ------------------------------------------------------------------------------- logging
def register_torch_logs() -> None:
    """Make the package's loggers a ``torch._logging`` log: ``TORCH_LOGS=overlap_backend`` shows one INFO
    line per match decision, ``TORCH_LOGS=+overlap_backend`` the DEBUG lines too;
    ``torch._logging.set_logs(modules={"overlap_backend": logging.INFO})`` does the same in code.

    The log's name is the package's, so a ``TORCH_LOGS`` that torch reads at its own import, before
    this runs, already finds it (torch takes a module name as a log); registering adds it to the
    names torch lists and keeps it a log whatever the order of imports."""
    try:
        from torch._logging import _internal as torch_logging
    except ImportError:  # pragma: no cover - a torch without torch._logging: plain Python logging only
        return
    torch_logging.register_log(TORCH_LOGS_NAME, [log.name])


def log_decisions(report: GraphReport, origin: str = "") -> None:
    """One INFO line per match in the words of summary.json; the whole record (cost, epilogue) at DEBUG."""
    if not log.isEnabledFor(logging.INFO):
        return
    for match in report.matches:
        record = match.to_json()
        log.info("graph %s%s: %s", report.id, origin, json.dumps({k: record[k] for k in DECISION_KEYS}))
        if log.isEnabledFor(logging.DEBUG):
            log.debug("graph %s: the whole record: %s", report.id, json.dumps(record, default=repr))


def report_from_json(saved: dict[str, Any], graph_id: str) -> GraphReport:
    """The :class:`GraphReport` that ``GraphReport.to_json`` wrote, under a new ``graph_id``."""
    matches = []
    for m in saved["matches"]:
        fields = {k: v for k, v in m.items() if k != "pass"}
        matches.append(MatchRecord(pass_name=m["pass"], **fields))
    return GraphReport(id=graph_id, kind=saved["kind"], matches=matches)


# -------------------------------------------------------------------- Inductor's caches
@dataclasses.dataclass(frozen=True)
class GroupFacts:
    """What the passes learn about one process group besides the graph, agreed by every rank: part of
    the pipeline's cache key (a graph rewritten for a symm-capable NCCL group is not one for gloo)."""

    name: str
    backend: str
    size: int
    symm: str | None  # runtime.symm.group_support's verdict (None: symm can run); "-": not asked
    calibrations: tuple[tuple[str, str], ...]  # (device type, calibration key and digest) the cost model prices with


def _is_collective(target: Any) -> bool:
    name = str(getattr(target, "__module__", "")) + "." + str(target)
    return "c10d_functional" in name or "_functional_collectives" in name


def group_names(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> list[str]:
    """The process groups a Dynamo graph communicates over, as far as it shows them: the group names
    its functional collectives take, and the meshes of its DTensor and DeviceMesh inputs."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    candidates: set[str] = set()
    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            if node.op == "call_function" and _is_collective(node.target):
                for arg in (*node.args, *node.kwargs.values()):
                    name = arg if isinstance(arg, str) else getattr(arg, "group_name", None)
                    if isinstance(name, str):
                        candidates.add(name)
    for x in example_inputs:
        mesh = getattr(x, "device_mesh", None) or (x if type(x).__name__ == "DeviceMesh" else None)
        for group in (mesh.get_all_groups() if mesh is not None else ()):
            candidates.add(group.group_name)
    names = []
    for name in sorted(candidates):
        try:
            _resolve_process_group(name)
        except Exception:  # noqa: BLE001 - a string argument that is no group (a reduce op's "sum")
            continue
        names.append(name)
    return names


# Inductor settings under which every rank compiles a graph with collectives to the same graph before the
# passes see it. Shape padding (``pad_mm``) times padded against unpadded matmuls on each rank's GPU at
# compile time and, where padding wins by 10%, rewrites ``mm`` into ``mm(cat(a, 0)) -> slice``, which no
# pass matches: a timing-dependent choice that can differ between ranks and runs (on two ranks sharing a
# GPU it dropped the rewrite of a 2100-row MLP in some runs and not others), so it is off there; the
# overlap ops replace those matmuls anyway.
RANK_STABLE_PATCHES = {"shape_padding": False}


def _device_types(example_inputs: list[Any]) -> set[str]:
    types = set()
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            types.add(x.device.type)
    return types


def group_facts(config: OverlapConfig, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> tuple[GroupFacts, ...]:
    """Each group's :class:`GroupFacts`, asked here on every rank whether Inductor's caches then hit or
    miss: the symm support check and the calibration the cost model uses agree with one collective per
    group and process (cached), so a rank whose cache misses never waits in one its peers skip."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    from .cost import decision as cost_decision
    from .runtime import symm

    if not config.passes or not dist.is_available() or not dist.is_initialized():
        return ()
    devices = _device_types(example_inputs)
    facts = []
    for name in group_names(gm, example_inputs):
        group = _resolve_process_group(name)
        verdict = symm.group_support(name) if config.lowering != "p2p" else "-"
        cals = []
        for device_type in sorted(devices & {"cpu", "cuda"}):
            cal = cost_decision.calibration_for(name, device_type, config.cache_dir,
                                                agree=cost_decision.active(config, device_type))
            numbers = {k: v for k, v in cal.to_json().items() if k not in ("source", "info")}
            digest = hashlib.sha256(json.dumps(numbers, sort_keys=True, default=repr).encode()).hexdigest()[:16]
            cals.append((device_type, f"{cal.key}:{digest}"))
        facts.append(GroupFacts(name, str(dist.get_backend(group)), group.size(), verdict, tuple(cals)))
    return tuple(facts)


# the package's layers above the backend (models, examples, tools) never change a rewritten graph
_SOURCE_SKIPPED = ("models", "examples", "tools")


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """A digest of the package's source below ``models/``, ``examples/`` and ``tools/``: the passes, the
    cost model and calibration defaults, the ops' schemas and lowerings, the config and knobs."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in _SOURCE_SKIPPED:
            continue
        digest.update(str(rel).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def pipeline_key(config: OverlapConfig, groups: tuple[GroupFacts, ...]) -> str:
    """The pipeline's ``CustomGraphPass.uuid()``: everything but the graph that its rewrite depends on."""
    from .spec.knobs import knobs_hash

    parts = {"config": config.rewrite_fields(), "passes_named": config.passes_named, "knobs": knobs_hash(),
             "groups": [dataclasses.asdict(g) for g in groups], "source": source_digest()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=repr).encode()).hexdigest()


def caches_off_reason(config: OverlapConfig) -> str | None:
    """Why this compile keeps Inductor's FX-graph and AOT-autograd caches off (None: they stay on)."""
    if CustomGraphPass is None:
        return "this torch has no torch._inductor.custom_graph_pass.CustomGraphPass to key the pipeline with"
    if config.debug_dir:
        return "OVERLAP_DEBUG_DIR is set: every graph is compiled afresh, so its dumps are written"
    return None


def _size(s: Any) -> str:
    """A size as the key sees it: a symbolic one with its hint (a pass's decision may guard on it, and a
    cached entry per guard set is a compile of its own)."""
    hint = getattr(getattr(s, "node", None), "hint", None)
    return f"{s}={hint}" if hint is not None and not isinstance(s, int) else str(s)


def _input_meta(x: Any) -> list[Any]:
    if not isinstance(x, torch.Tensor):
        return [type(x).__name__, _size(x)]
    try:
        stride = [_size(s) for s in x.stride()]
    except Exception:  # noqa: BLE001 - a layout without strides
        stride = str(x.layout)
    meta = [type(x).__name__, [_size(s) for s in x.shape], stride, str(x.dtype), str(x.device), x.requires_grad]
    if hasattr(x, "placements"):  # DTensor
        meta += [str(x.placements), str(x.device_mesh)]
    return meta


def compile_key(pipeline: str, gm: torch.fx.GraphModule, example_inputs: list[Any], patches: dict) -> str:
    """What decides a Dynamo graph's rewritten graphs, and so its reports: the pipeline key, the graph,
    its inputs' metadata, Inductor's and AOTAutograd's config (with the compile's patches), grad mode."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config

    codes = [m.code for m in gm.modules() if isinstance(m, torch.fx.GraphModule)]
    with inductor_config.patch(patches):
        inductor = inductor_config.save_config_portable()
    # whether the caches are on changes no result (Inductor's portable config already leaves its switches out)
    functorch = {k: v for k, v in functorch_config.save_config_portable().items() if "cache" not in k}
    parts = [pipeline, torch.__version__, codes, [_input_meta(x) for x in example_inputs], inductor, functorch,
             torch.is_grad_enabled()]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=repr).encode()).hexdigest()


class ReportStore:
    """The reports of one compile (a Dynamo graph's forward and backward, or its inference graph) in a
    small file under ``<cache>/reports/`` (``spec.cache``), named by :func:`compile_key`, written as
    the pass produces them and read when Inductor serves those graphs from its caches."""

    def __init__(self, path: Path | None):
        self.path = path

    @classmethod
    def for_compile(cls, config: OverlapConfig, pipeline: str, gm: torch.fx.GraphModule, example_inputs: list[Any],
                    patches: dict) -> ReportStore:
        from .spec.cache import cache_path

        try:
            key = compile_key(pipeline, gm, example_inputs, patches)
        except Exception as e:  # noqa: BLE001 - without a key the reports are not replayed, nothing else
            log.debug("overlap_backend: no report store for this compile (%s: %s)", type(e).__name__, e)
            return cls(None)
        return cls(cache_path("reports", config.cache_dir) / f"{key}.json")

    def save(self, reports: list[dict[str, Any]]) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"reports": reports}, default=repr))
            os.replace(tmp, self.path)
        except OSError as e:
            log.debug("overlap_backend: could not save the reports to %s (%s)", self.path, e)

    def load(self) -> list[dict[str, Any]]:
        if self.path is None:
            return []
        try:
            return list(json.loads(self.path.read_text())["reports"])
        except (OSError, ValueError, KeyError, TypeError):
            return []


_PassBase = CustomGraphPass if CustomGraphPass is not None else object
_said: set[str] = set()  # the reasons for caches off already logged at INFO


class PipelinePass(_PassBase):
    """The pipeline as Inductor's post-grad custom pass for one compile (one Dynamo graph)."""

    def __init__(self, backend: OverlapBackend, groups: tuple[GroupFacts, ...], store: ReportStore):
        self.backend = backend
        self.groups = groups
        self.store = store
        self.runs = 0  # graphs the pipeline ran on
        self.known: list[dict[str, Any]] = []  # this compile's reports, run or replayed, as saved
        self._saved: list[dict[str, Any]] | None = None  # the store's reports not yet replayed
        self.replayed = 0

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.runs += 1
        report = self.backend.run_pipeline(graph)
        self.known.append(report.to_json())
        self.store.save(self.known)

    def uuid(self) -> str:
        return pipeline_key(self.backend.config, self.groups)

    def _unreplayed(self) -> list[dict[str, Any]]:
        if self._saved is None:
            self._saved = self.store.load()
        return self._saved

    def _replay(self, saved: dict[str, Any]) -> None:
        self._unreplayed().remove(saved)
        self.replayed += 1
        self.known.append(saved)
        self.backend.replay(saved)

    def served_from_cache(self, kind: str) -> None:
        """The FX-graph cache served one ``kind`` graph of this compile: replay its report."""
        saved = next((r for r in self._unreplayed() if r.get("kind") == kind), None)
        if saved is None:
            log.info("overlap_backend: a %s graph came from Inductor's cache and its report was not found in %s",
                     kind, self.store.path)
            return
        self._replay(saved)

    def after_compile(self) -> None:
        """``compile_fx`` returned: where neither the pass nor the FX-graph cache saw a graph, the
        AOT-autograd cache served them all (forward and backward at once): replay every report."""
        if self.runs or self.replayed:
            return
        for saved in list(self._unreplayed()):
            self._replay(saved)


class OverlapBackend:
    """A ``torch.compile`` backend callable bound to one :class:`OverlapConfig`."""

    def __init__(self, config: OverlapConfig):
        self.config = config
        self.manager = build_manager(config.passes, config)
        self.reports: list[GraphReport] = []
        self.graph_breaks = GraphBreakTracker()
        self._breaks: dict[str, int] = {}  # counted before the Dynamo graph being compiled now

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
        if kind != "backward":  # a pattern that graph breaks split: which breaks, and what to set
            breaks, self._breaks = self._breaks or self.graph_breaks.recent, {}
            report.matches.extend(split_pattern_records(graph, breaks, report.matches))
        if dumper is not None:
            dumper.ops(graph, captured=ctx.cuda_graphs)
            dumper.finish()
        self._publish(report)
        return report

    def _publish(self, report: GraphReport, origin: str = "") -> None:
        self.reports.append(report)
        REPORTS.append(report)
        log_decisions(report, origin)
        debug.record(self.config.debug_dir, report)

    def replay(self, saved: dict[str, Any]) -> GraphReport:
        """Publish the report of a graph Inductor served from its cache, as saved when it was compiled."""
        report = report_from_json(saved, f"{next(_graph_counter):03d}_{saved['kind']}")
        self._publish(report, " (compiled from Inductor's cache)")
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
        self._breaks = self.graph_breaks.take()
        if self.config.disable:  # plain Inductor: untouched, but for what mode/options ask
            rank_config.publish(self.config, "")  # (store keys only: peers that are not disabled can name this rank)
            return compile_fx(gm, example_inputs, **({"config_patches": patches} if patches else {}))
        names = group_names(gm, example_inputs)
        if names:
            patches.update(RANK_STABLE_PATCHES)
            rank_config.agree(self.config, names, source_digest())  # before any communication of ours
        if not self.config.inductor:
            with torch._functorch.config.patch(enable_autograd_cache=False):  # our compilers are not cacheable
                return self._compile_without_inductor(gm, example_inputs)
        why_uncached = caches_off_reason(self.config)
        if why_uncached is not None:
            # said once per reason at INFO where it is a surprise (an old torch), at DEBUG where it was asked for
            level = logging.DEBUG if why_uncached in _said or self.config.debug_dir else logging.INFO
            _said.add(why_uncached)
            log.log(level, "overlap_backend: Inductor's FX-graph and AOT-autograd caches are off for this compile: %s",
                    why_uncached)
            with torch._functorch.config.patch(enable_autograd_cache=False):
                return compile_fx(gm, example_inputs, inner_compile=_kind_tracking_inner_compile,
                                  config_patches={**patches, "post_grad_custom_post_pass": self._post_grad_pass,
                                                  "fx_graph_cache": False})
        # Every rank reaches this point for every graph, cached or not: the agreements the passes need
        # (collectives) happen here, never only on the ranks whose cache missed.
        groups = group_facts(self.config, gm, example_inputs)
        pipeline = PipelinePass(self, groups, ReportStore.for_compile(self.config, pipeline_key(self.config, groups),
                                                                      gm, example_inputs, patches))
        compiled = compile_fx(gm, example_inputs, inner_compile=_kind_tracking_inner_compile,
                              config_patches={**patches, "post_grad_custom_post_pass": pipeline})
        pipeline.after_compile()
        return compiled

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
    from torch._inductor import config as inductor_config

    pipeline = inductor_config.post_grad_custom_post_pass
    ran = pipeline.runs if isinstance(pipeline, PipelinePass) else None
    token = _graph_kind.set(kind)
    try:
        compiled = compile_fx_inner(gm, example_inputs, *args, **kwargs)
    finally:
        _graph_kind.reset(token)
    if ran is not None and pipeline.runs == ran:  # the FX-graph cache served it: the pass did not run
        pipeline.served_from_cache(kind)
    return compiled


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
