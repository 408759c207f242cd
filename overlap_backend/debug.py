"""Graph-diff dumps (``OVERLAP_DEBUG_DIR``).

Layout, per process (rank R of the default group, 0 when torch.distributed is not initialised)::

    <dir>/rank<R>/summary.json                  {"graphs": [{"id", "kind", "matches": [...]}]}
    <dir>/rank<R>/<graph-id>/00_before.py        the post-grad graph as our pipeline received it
    <dir>/rank<R>/<graph-id>/NN_after_<pass>.py  after each pass
    <dir>/rank<R>/<graph-id>/NN_<pass>.diff      unified diff, for each pass that changed something
    <dir>/rank<R>/<graph-id>/diff.html           side-by-side diff, before vs after all passes
    <dir>/rank<R>/<graph-id>/ops/<node>.py       per rewritten ag_mm/mm_rs/mm_ar op: its call, the
                                                 generated Triton epilogue source(s), and the
                                                 runtime calls it issues on this rank (runtime/plan.py)

``<graph-id>`` is ``<counter>_<kind>``, the counter counting graphs compiled in this process.

A directory that cannot hold the dumps (a file, a path under one, no permission, a full disk) costs
the dumps, never the compile: the first failed write logs one warning naming ``OVERLAP_DEBUG_DIR``
and the path, and nothing more is written there by this process.
"""

from __future__ import annotations

import difflib
import functools
import json
import logging
import os
import threading
from pathlib import Path

import torch.fx

from .passes.manager import GraphReport

log = logging.getLogger("overlap_backend")

_lock = threading.Lock()
_summaries: dict[Path, list[GraphReport]] = {}
# debug directories a write failed in, and why: one warning each, then no more writes there
_failed: dict[str, str] = {}


def dumps_failed(debug_dir: str | os.PathLike, error: OSError) -> None:
    """Stop writing under ``debug_dir`` (this process), with one warning naming the variable and path."""
    key = os.fspath(debug_dir)
    with _lock:
        first = key not in _failed
        _failed.setdefault(key, f"{type(error).__name__}: {error}")
    if first:
        log.warning("OVERLAP_DEBUG_DIR=%s cannot hold the graph dumps (%s: %s): the dumps and summary.json are "
                    "skipped from now on in this process; the model compiles and runs as it would without it",
                    key, type(error).__name__, error)


def dumps_off(debug_dir: str | os.PathLike) -> bool:
    """Has a write under ``debug_dir`` failed in this process?"""
    return os.fspath(debug_dir) in _failed


def _skipped_on_os_error(method):
    """A dump step that turns the dumper off (:func:`dumps_failed`) instead of raising an OSError."""

    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        if self.off or dumps_off(self.debug_dir):
            self.off = True
            return None
        try:
            return method(self, *args, **kwargs)
        except OSError as e:
            self.off = True
            dumps_failed(self.debug_dir, e)
            return None

    return guarded


def graph_source(graph: torch.fx.Graph) -> str:
    try:
        return graph.python_code(root_module="self").src.strip() + "\n"
    except Exception:  # noqa: BLE001 - a graph that cannot codegen is still worth dumping
        return str(graph) + "\n"


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def rank_dir(debug_dir: str | os.PathLike) -> Path:
    return Path(debug_dir) / f"rank{_rank()}"


class GraphDumper:
    """Observer for :class:`PassManager`: writes the graph before and after each pass."""

    def __init__(self, debug_dir: str | os.PathLike, graph_id: str):
        self.debug_dir = debug_dir
        self.dir = rank_dir(debug_dir) / graph_id
        self.step = 0
        self.first = self.last = ""
        self.off = False
        self._make_dir()

    @_skipped_on_os_error
    def _make_dir(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)

    @_skipped_on_os_error
    def before(self, graph: torch.fx.Graph) -> None:
        self.first = self.last = graph_source(graph)
        (self.dir / "00_before.py").write_text(self.first)

    @_skipped_on_os_error
    def after_pass(self, pass_name: str, graph: torch.fx.Graph) -> None:
        self.step += 1
        src = graph_source(graph)
        (self.dir / f"{self.step:02d}_after_{pass_name}.py").write_text(src)
        if src != self.last:
            diff = difflib.unified_diff(
                self.last.splitlines(keepends=True), src.splitlines(keepends=True),
                fromfile=f"before_{pass_name}", tofile=f"after_{pass_name}",
            )
            (self.dir / f"{self.step:02d}_{pass_name}.diff").write_text("".join(diff))
        self.last = src

    @_skipped_on_os_error
    def ops(self, graph: torch.fx.Graph, captured: bool = False) -> None:
        """One file per rewritten op of ``graph``: call, generated epilogues, runtime calls
        (``captured``: the graph will be replayed from a CUDA graph)."""
        for node in graph.nodes:
            if node.op == "call_function" and node.target in _dumped_ops():
                try:
                    text = op_listing(node, captured)
                except Exception as e:  # noqa: BLE001 - a dump must never fail the compile
                    text = f"# could not describe {node.name}: {type(e).__name__}: {e}\n"
                (self.dir / "ops").mkdir(exist_ok=True)
                (self.dir / "ops" / f"{node.name}.py").write_text(text)

    @_skipped_on_os_error
    def finish(self) -> None:
        html = difflib.HtmlDiff(wrapcolumn=110).make_file(
            self.first.splitlines(), self.last.splitlines(), "before passes", "after passes", context=True
        )
        (self.dir / "diff.html").write_text(html)


def record(debug_dir: str | os.PathLike | None, report: GraphReport) -> None:
    """Add ``report`` to this process's summary.json (rewritten whole, so it is always valid)."""
    if debug_dir is None or dumps_off(debug_dir):
        return
    path = rank_dir(debug_dir)
    try:
        with _lock:
            reports = _summaries.setdefault(path.resolve(), [])
            reports.append(report)
            path.mkdir(parents=True, exist_ok=True)
            tmp = path / "summary.json.tmp"
            tmp.write_text(json.dumps({"graphs": [r.to_json() for r in reports]}, indent=2))
            os.replace(tmp, path / "summary.json")
    except OSError as e:
        dumps_failed(debug_dir, e)
        return
    log.debug("overlap_backend: wrote %s", path / "summary.json")


def _dumped_ops():
    return {torch.ops.overlap.ag_mm.default: "ag_mm", torch.ops.overlap.mm_rs.default: "mm_rs",
            torch.ops.overlap.mm_ar.default: "mm_ar", torch.ops.overlap.moe_experts.default: "moe_experts",
            torch.ops.overlap.cta_pipeline_mlp.default: "cta_pipeline_mlp"}


def op_listing(node: torch.fx.Node, captured: bool = False) -> str:
    """The dump of one op node: its graph call, the Triton source generated for each epilogue
    spec, and ``runtime.plan.render``'s runtime calls, as one Python file."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    from .codegen import epilogue as gen
    from .spec import epilogue as spec_mod
    from .runtime import plan

    op = _dumped_ops()[node.target]
    schema = node.target._schema
    values = {}
    for i, a in enumerate(schema.arguments):
        raw = node.args[i] if i < len(node.args) else node.kwargs.get(a.name, a.default_value)
        values[a.name] = torch.fx.node.map_aggregate(raw, lambda x: x.meta.get("val") if isinstance(x, torch.fx.Node) else x)
    group = _resolve_process_group(values["group_name"])
    rank, ws = group.rank(), group.size()
    parts = [f'"""overlap::{op} ({node.name}), rank {rank} of {ws}: generated code and runtime calls."""',
             f"# graph: {node.format_node()}", ""]
    spec = values.get("epilogue") or ""
    specs, dtype = [], None  # moe_experts, cta_pipeline_mlp: no epilogue
    if op == "ag_mm":
        specs = spec_mod.split_outputs(spec, len(values["weights"]))
        dtype = values["shard"].dtype
    elif op in ("mm_rs", "mm_ar"):
        specs = [spec] if spec else []
        dtype = torch.result_type(values["a"], values["b"])
    for i, s in enumerate(specs):
        if not s:
            continue
        try:
            source, _ = gen.emit(s, dtype)
            renamed = (source.replace("def epilogue(", f"def epilogue_{i}(")
                       .replace("def pointwise_kernel(", f"def pointwise_kernel_{i}(")
                       .replace("def reduce_kernel(", f"def reduce_kernel_{i}(")
                       .replace("= epilogue(x", f"= epilogue_{i}(x"))
            parts += [f"# ---- epilogue of output {i}: {s!r} (cache key {gen.cache_key(source)[:24]}) ----", renamed, ""]
        except gen.Unsupported as e:
            parts += [f"# epilogue of output {i}: {s!r} has no generated kernel ({e}): torch ops run it", ""]
    parts += ["# ---- runtime calls ----", plan.render(op, values, rank, ws, captured)]
    return "\n".join(parts)
