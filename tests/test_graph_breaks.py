"""graph_breaks: Dynamo's graph-break messages, what the user can set, and the moe records of split patterns."""

import torch
import torch.fx

from overlap_backend.graph_breaks import GraphBreakTracker, advice, split_pattern_records, summarize
from overlap_backend.passes import MatchRecord


def _compile_with_a_break():
    """A function whose .tolist() breaks the graph (capture_scalar_outputs off)."""
    def f(x):
        sizes = (x.abs().sum(0) > 0).long().tolist()
        return x * len(sizes) + sum(sizes)

    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_scalar_outputs=False):
        torch.compile(f, backend="eager")(torch.randn(4, 3))


def test_tracker_takes_the_breaks_counted_since_last_take():
    tracker = GraphBreakTracker()
    assert tracker.take() == {}
    _compile_with_a_break()
    new = tracker.take()
    assert new and any("_local_scalar_dense" in msg for msg in new), new
    assert tracker.recent == new
    assert tracker.take() == {} and tracker.recent == new  # nothing new; the last breaks are kept


def test_summary_and_advice_of_a_real_message():
    tracker = GraphBreakTracker()
    _compile_with_a_break()
    msg = next(m for m in tracker.take() if "_local_scalar_dense" in m)
    s = summarize(msg)
    assert s["reason"].startswith("Data dependent operator"), s
    assert "_local_scalar_dense" in s["explanation"] and any("capture_scalar_outputs" in h for h in s["hints"]), s
    fixes = advice(msg)
    assert any("capture_scalar_outputs = True" in f for f in fixes) and not any("overlap_all_to_all" in f for f in fixes)
    assert any('ep_implementation="overlap_all_to_all"' in f for f in advice(msg, transformers_ep=True))


def test_chained_breaks_and_breaks_without_a_setting():
    msg = ("Data dependent operator\n  Explanation: x\n  Hint: y\n\n"
           "*** While handling this graph break, another graph break occurred: ***\n\n"
           "Graph break under GenericContextWrappingVariable\n  Explanation: z\n")
    assert summarize(msg)["reason"] == "Data dependent operator -> Graph break under GenericContextWrappingVariable"
    assert any(f.startswith("no setting") for f in advice("Data-dependent branching\n  Explanation: if x.item()"))


def _graph_with_all_to_alls(n: int) -> torch.fx.Graph:
    g = torch.fx.Graph()
    x = g.placeholder("x")
    outs = []
    for _ in range(n):
        a = g.call_function(torch.ops._c10d_functional.all_to_all_single.default, (x, [2, 2], [2, 2], "0"))
        outs.append(g.call_function(torch.ops._c10d_functional.wait_tensor.default, (a,)))
    g.output(tuple(outs))
    return g


def test_split_pattern_records():
    g = _graph_with_all_to_alls(2)
    names = [n.name for n in g.nodes if n.target is torch.ops._c10d_functional.all_to_all_single.default]
    breaks = {"Data dependent operator\n  Explanation: Operator `aten._local_scalar_dense.default` ...": 2}
    [rec] = split_pattern_records(g, breaks, [])
    assert rec.pass_name == "moe" and not rec.applied and rec.nodes == names
    assert rec.graph_break[0]["count"] == 2 and "capture_scalar_outputs = True" in rec.graph_break[0]["set"][0]
    assert "graph_break" in rec.to_json() and "graph_break" not in MatchRecord("moe", True, "p2p", [], "x").to_json()
    # no break, or every all-to-all already in a moe match: nothing to add
    assert split_pattern_records(g, {}, []) == []
    taken = MatchRecord("moe", True, "p2p", names, "rewritten")
    assert split_pattern_records(g, breaks, [taken]) == []
