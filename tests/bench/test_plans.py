"""bench/tools/plans: every stages file parses, names scripts that exist (from the repository root, where
bench/tools/run_stages.sh runs its stages) and test selections that select tests: a typo must not cost a device call."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLANS = sorted((REPO / "bench" / "tools" / "plans").glob("*.sh"))
# `run NAME CAP CMD...` replaced by a printer of CMD's words (each ends in NUL, a stage in an empty word)
_PRINT_STAGES = 'run() { shift 2; printf "%s\\0" "$@"; printf "\\0"; }; RES=/res; TRACES=/traces; W=/w; source "$1"'


def stages(plan: Path) -> list[list[str]]:
    """The command words of every stage of ``plan``, as bash expands them when run_stages.sh sources it."""
    out = subprocess.run(["bash", "-c", _PRINT_STAGES, "bash", str(plan)], capture_output=True, cwd=REPO,
                         check=True).stdout.decode()
    found, words = [], []
    for word in out.split("\0")[:-1]:
        if word:
            words.append(word)
        else:
            found.append(words)
            words = []
    return found


def pytest_selection(words: list[str]) -> tuple[list[str], list[str]] | None:
    """(the test files and folders, the -k / -m options) of a stage that runs pytest; None for any other stage."""
    if "pytest" not in words:
        return None
    args = words[words.index("pytest") + 1:]
    files = [w for w in args if w.startswith("tests/")]
    options = []
    for flag in ("-k", "-m"):
        if flag in args:
            options += [flag, args[args.index(flag) + 1]]
    return files, options


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p.name)
def test_plan_names_scripts_that_exist(plan):
    found = stages(plan)
    assert found, f"{plan.name}: no stage"
    for words in found:
        for w in words:
            if re.fullmatch(r"[\w./-]+\.py", w):
                assert (REPO / w).is_file(), f"{plan.name}: {w} is not a file under the repository root ({words})"


def test_every_test_selection_of_the_plans_selects_tests():
    selections = {}
    for plan in PLANS:
        for words in stages(plan):
            sel = pytest_selection(words)
            if sel is not None:
                selections.setdefault((tuple(sel[0]), tuple(sel[1])), []).append(plan.name)
    assert selections, "no plan runs tests"
    env = {**os.environ, "OVERLAP_TEST_SHARED_GPU": "1"}
    # One process collects every selection (torch and the test modules imported once): its last line, a JSON list
    # of (the number of tests selected, pytest's exit code, its output's end) per selection.
    res = subprocess.run([sys.executable, "-c", _COLLECT_EACH, json.dumps(list(selections))], capture_output=True,
                         text=True, cwd=REPO, env=env)
    assert res.returncode == 0 and res.stdout.strip(), res.stderr[-2000:]
    counts = json.loads(res.stdout.strip().splitlines()[-1])
    for ((files, options), plans), (selected, code, tail) in zip(selections.items(), counts):
        assert code == 0 and selected > 0, (
            f"{plans}: pytest {' '.join(options)} {' '.join(files)} selects no test (exit {code}):\n{tail}")


_COLLECT_EACH = """
import contextlib, io, json, sys
import pytest

class Count:
    selected = 0

    def pytest_collection_finish(self, session):
        Count.selected = len(session.items)

found = []
for files, options in json.loads(sys.argv[1]):
    Count.selected, out = 0, io.StringIO()
    with contextlib.redirect_stdout(out):
        code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *options, *files], plugins=[Count()])
    found.append((Count.selected, int(code), out.getvalue()[-800:]))
print(json.dumps(found))
"""


def test_every_option_the_plans_pass_a_script_is_one_it_takes():
    """Each ``--option`` a stage passes to a ``bench/`` script (after the script's path) is in that script's --help,
    each ``--set`` names a knob that exists."""
    used: dict[str, set[str]] = {}
    sets: list[str] = []
    for plan in PLANS:
        for words in stages(plan):
            scripts = [i for i, w in enumerate(words) if re.fullmatch(r"bench/[\w./-]+\.py", w)]
            if scripts:
                i = scripts[0]
                used.setdefault(words[i], set()).update(w.split("=")[0] for w in words[i + 1:] if w.startswith("--"))
                sets += [words[j + 1] for j in range(i + 1, len(words) - 1) if words[j] == "--set"]
    assert used, "no plan runs a bench script"
    from overlap_backend.spec import knobs

    for assignment in sets:  # --set <set>.<KNOB>=<value>: a knob that exists
        group, _, name = assignment.partition("=")[0].partition(".")
        assert name in getattr(knobs, group).values(), f"--set {assignment}: knobs.{group} has no {name}"

    def help_text(script):
        return subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, cwd=REPO).stdout

    with ThreadPoolExecutor(4) as pool:
        helps = dict(zip(used, pool.map(help_text, used)))
    for script, options in used.items():
        taken = set(re.findall(r"--[\w-]+", helps[script]))
        assert taken, f"{script} --help printed no option"
        assert options <= taken, f"{script} does not take {sorted(options - taken)} (takes {sorted(taken)})"

