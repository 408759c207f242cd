"""The package's layers (docs/architecture.md#layout): no import cycle, and no import from a lower layer
to a higher one. The graph is built from every import statement, function-level ones included, so an
import moved into a function to dodge a cycle is still seen."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "overlap_backend"

# Bottom to top: a module may import from its own layer or below. The longest matching prefix decides.
LAYERS = {
    "overlap_backend.config": 0,
    "overlap_backend.spec": 0,
    "overlap_backend.codegen": 1,
    "overlap_backend.runtime": 2,
    "overlap_backend.cost": 3,
    "overlap_backend.passes": 4,
    "overlap_backend.debug": 5,
    "overlap_backend.backend": 5,
    "overlap_backend": 5,  # the package's __init__: the public API
    "overlap_backend.models": 6,
    "overlap_backend.examples": 6,
    "overlap_backend.tools": 6,
}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    """The package module an imported name lands in (a name inside a module resolves to the module)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                # "from pkg import name" imports the submodule pkg.name where there is one
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                r = _resolve(t, mods) if t.startswith("overlap_backend") else None
                if r and r != mod:
                    edges[mod].add(r)
    return edges


def layer(mod: str) -> int:
    best = max((p for p in LAYERS if mod == p or mod.startswith(p + ".")), key=len)
    return LAYERS[best]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_is_seen():
    """The graph builder sees relative, absolute and function-level imports (else the tests below pass
    on an empty graph)."""
    edges = import_graph()
    assert "overlap_backend.config" in edges["overlap_backend.backend"]
    assert any(e.startswith("overlap_backend.spec") for e in edges["overlap_backend.passes.ag_mm"])
    assert len(edges) > 40 and sum(map(len, edges.values())) > 100


def test_no_import_cycle():
    assert _cycles(import_graph()) == []


def test_no_import_from_a_lower_layer_to_a_higher_one():
    edges = import_graph()
    upward = sorted(f"{m} (layer {layer(m)}) imports {t} (layer {layer(t)})"
                    for m, ts in edges.items() for t in ts if layer(t) > layer(m))
    assert upward == []


def test_config_imports_nothing_of_the_package():
    assert import_graph()["overlap_backend.config"] == set()
