"""Docs stay in step with the code: every OVERLAP_* variable documented, a generated before/after
example for every pass, the benchmark plots regenerate from the committed results."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _env_table() -> dict[str, str]:
    """``OverlapConfig._ENV`` read from config.py's source: field -> variable."""
    tree = ast.parse((ROOT / "overlap_backend" / "config.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_ENV" for t in node.targets):
            return {k.value: v.elts[0].value for k, v in zip(node.value.keys, node.value.values)}
    raise AssertionError("no _ENV table in config.py")


def test_every_env_var_is_documented():
    from overlap_backend import OverlapConfig

    table = _env_table()
    assert table == OverlapConfig.env_vars()
    doc = (ROOT / "docs" / "config.md").read_text()
    rows = set(re.findall(r"^\| `(OVERLAP_\w+)` \|", doc, re.M))
    missing = sorted(set(table.values()) - rows)
    assert not missing, f"docs/config.md has no table row for {missing}"
    stale = sorted(rows - set(table.values()))
    assert not stale, f"docs/config.md documents variables config.py does not read: {stale}"


def _examples_module():
    spec = importlib.util.spec_from_file_location("make_pass_examples", ROOT / "docs" / "make_pass_examples.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks itself up there
    spec.loader.exec_module(mod)
    return mod


def test_every_pass_has_a_generated_example():
    mod = _examples_module()
    doc = (ROOT / "docs" / "passes.md").read_text()
    begins = re.findall(r"<!-- BEGIN GENERATED (\w+) \(docs/make_pass_examples.py\) -->", doc)
    ends = re.findall(r"<!-- END GENERATED (\w+) -->", doc)
    names = [ex.name for ex in mod.EXAMPLES]
    assert begins == ends and sorted(begins) == sorted(names)
    shown = {p for ex in mod.EXAMPLES for p in ex.show[1:]}
    assert {"ag_mm", "mm_rs", "mm_ar", "moe", "cta_pipeline"} <= shown
    assert any(ex.name.startswith("epilogue") for ex in mod.EXAMPLES)
    for name in begins:  # no block left empty
        body = doc.split(f"<!-- BEGIN GENERATED {name} (docs/make_pass_examples.py) -->\n", 1)[1]
        body = body.split("<!-- END", 1)[0]
        assert "torch.ops" in body or '"pass"' in body, name


def test_generated_examples_are_up_to_date():
    """docs/passes.md's generated graph excerpts are what the passes write today (the generator runs
    the same rewrites; it failed for a while unnoticed when an op gained an argument its stub lacked,
    and a rewrite that orders nodes by set iteration made the excerpts differ from run to run)."""
    out = subprocess.run([sys.executable, str(ROOT / "docs" / "make_pass_examples.py"), "--check"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]


def test_bench_plots_regenerate(tmp_path):
    """Every plot of a committed result (a result folder, its parts, their runN/ folders) is what
    bench/tools/plot.py draws from the committed JSON."""
    spec = importlib.util.spec_from_file_location("bench_plot", ROOT / "bench" / "tools" / "plot.py")
    plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot)
    svgs = 0
    for root in plot.run_roots():
        for f in sorted(root.glob("*.json")) + sorted(root.glob("run*/*.json")):
            out = plot.plot_file(f, tmp_path / f.parent.relative_to(plot.RESULTS))
            if out is None:
                continue
            svgs += 1
            ET.fromstring(out.read_text())  # well-formed
            committed = f.parent / out.name
            assert committed.exists() and committed.read_text() == out.read_text(), \
                f"{committed} is missing or stale: run python bench/tools/plot.py"
    assert svgs >= 4
    for page in (ROOT / "docs").glob("*.md"):
        for ref in re.findall(r"\]\((\.\./bench/results/[^)]+\.svg)\)", page.read_text()):
            assert (ROOT / "docs" / ref).resolve().exists(), (page.name, ref)


def test_relative_links_point_at_files():
    """Every relative link of README.md, docs/*.md, bench/README.md and the results' INDEX.md and READMEs
    names a file or folder that exists."""
    results = ROOT / "bench" / "results"
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md",
             results / "INDEX.md", *sorted(results.rglob("README.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor in the same page
            path = target.split("#", 1)[0]
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "links to nothing:\n" + "\n".join(broken)
