"""bench/probes/probe_compile.py: an op kernel compiled for Hopper on a machine without a GPU, and what its TTGIR
shows (here: mm_rs's partial-load loop multi-buffered only when pipelined) and what ptxas reports of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]


def _probe(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "1"}  # as in CI: the probe must turn the interpreter off itself
    return subprocess.run([sys.executable, str(ROOT / "bench/probes/probe_compile.py"), *args], env=env,
                          capture_output=True, text=True, timeout=600)


def test_partial_loads_pipelined_only_with_stages(tmp_path):
    reps = {}
    for stages in (1, 3):
        got = _probe("mm_rs", "--set", "WS=8", "--set", f"PARTIAL_STAGES={stages}", "--json", "--out", str(tmp_path))
        assert got.returncode == 0, got.stderr[-2000:]
        reps[stages] = json.loads(got.stdout.strip().splitlines()[-1])
    assert reps[1]["wgmma"] > 0 and reps[1]["shared_bytes"] > 0
    assert reps[3]["TMA loads"] > reps[1]["TMA loads"], "the pipelined loop issues loads ahead (prologue)"
    assert reps[3]["multi-buffered shared"] > reps[1]["multi-buffered shared"], "two partial buffers in flight"
    assert "ttng.warp_group_dot" in (tmp_path / "mm_rs.ttgir").read_text()
    assert (tmp_path / "mm_rs.ptx").stat().st_size > 0
    assert 128 <= reps[3]["registers"] <= 255, "ptxas's report: a 128x256 float32 accumulator over 8 warps"
    assert isinstance(reps[3]["ptxas warnings"], list) and reps[3]["spill stores (bytes)"] >= 0


def test_an_unknown_constexpr_is_refused():
    got = _probe("ag_mm", "--set", "FLATTENED=True")
    assert got.returncode != 0 and "ag_mm has no constexpr ['FLATTENED']" in got.stderr


def test_ptxas_reports_spills():
    """ag_mm's 128x256 float32 accumulator over 4 warps: 256 registers a thread, past the 255 a thread can have,
    so ptxas must spill."""
    got = _probe("ag_mm", "--warps", "4", "--json")
    assert got.returncode == 0, got.stderr[-2000:]
    rep = json.loads(got.stdout.strip().splitlines()[-1])
    assert rep["registers"] == 255 and rep["spill stores (bytes)"] > 0


@pytest.mark.parametrize("args", [(), ("--set", "PEERS_BY_COLUMN=True", "--set", "B_KMAJOR=False", "--set", "HAS_BIAS=True"),
                                  ("--set", "COOP=True", "--set", "BN=256", "--set", "STAGES=3"),
                                  ("--set", "HAS_BIAS=True", "--epilogue", "gelu_tanh,add:0")],
                         ids=["pingpong", "pingpong_column_order_kxn_bias", "coop", "pingpong_generated_epilogue"])
def test_ag_mm_ws_is_warp_specialized_without_spills(args):
    """ag_mm's Gluon kernel: a loader and a second MMA partition beside the default one, TMA loads into a ring and TMA
    stores out, wgmma, within Hopper's shared memory, and the register budgets met without a spill; a generated
    epilogue (a ``tl`` function) compiled on the accumulator's layout."""
    got = _probe("ag_mm_ws", "--json", *args)
    assert got.returncode == 0, got.stderr[-2000:]
    rep = json.loads(got.stdout.strip().splitlines()[-1])
    assert rep["worker partitions"] == 2 and rep["wgmma"] > 0 and rep["TMA loads"] > 0 and rep["TMA stores"] > 0
    assert 0 < rep["shared_bytes"] <= 232448, "the ring's stages and two store buffers within Hopper's shared memory"
    assert rep["registers"] == 168 and rep["spill stores (bytes)"] == 0 and rep["spill loads (bytes)"] == 0


@pytest.mark.parametrize("kernel,args", [
    ("ag_mm_ws", ()),
    ("ag_mm_ws", ("--epilogue", "bias:0,gelu", "--set", "EP_VALUES=16")),
    ("ag_mm_ws", ("--epilogue", "bias:0,gelu", "--set", "EP_VALUES=16", "--set", "COOP=True", "--set", "BN=256",
                  "--set", "STAGES=3")),
    ("mm_rs_ws", ("--set", "WS=8")),
    ("moe_down_ws", ()),
    ("moe_down_ws", ("--set", "COOP=True", "--set", "BN=256", "--set", "STAGES=3", "--set", "B_KMAJOR=True",
                     "--set", "EXPERT_MAJOR=True")),
    ("cta_stage0_ws", ("--epilogue", "gelu_tanh")),
    ("cta_stage0_ws", ("--epilogue", "bias:0,gelu", "--set", "COOP=True", "--set", "BN=256", "--set", "STAGES=3",
                       "--set", "WAIT_READY=True", "--set", "TP=2")),
], ids=["ag_plain", "ag_pieces", "ag_coop_pieces", "rs_sum_pieces", "moe_down_pingpong", "moe_down_coop_kmajor",
        "cta_stage0_pingpong_gelu_tanh", "cta_stage0_coop_bias_gelu_ready"])
def test_gluon_tma_copies_read_fenced_memory(kernel, args):
    """Every TMA store of the Gluon kernels follows the writers' proxy fence and then the partition barrier (the
    other order let a warp's store read another warp's writes before that warp's fence: stale tiles), and every
    partition makes the TMA descriptors it copies through (one made before the partitions, in the default one's
    preamble, was read stale by the others: tiles of an earlier call's tensors)."""
    got = _probe(kernel, "--json", *args)
    assert got.returncode == 0, got.stderr[-2000:]
    rep = json.loads(got.stdout.strip().splitlines()[-1])
    assert rep["TMA stores fenced, then synchronized"] > 0
    assert rep["TMA stores not fenced before the barrier"] == 0
    assert rep["worker partitions"] == 2 and rep["worker partitions handed a TMA descriptor"] == 0
    assert 0 < rep["shared_bytes"] <= 232448, "the ring's stages and two store buffers within Hopper's shared memory"
    assert rep["registers"] == 168 and rep["spill stores (bytes)"] == 0 and rep["spill loads (bytes)"] == 0


def test_gluon_generated_epilogue_is_a_loop_over_pieces():
    """bias + erf GELU is ~70 instructions a value: unrolled over the tile's 128 values a thread it made the persistent
    kernel 5-6x the plain one's size (fetched again on every tile); as a loop over pieces it stays under 2x."""
    sizes = {}
    for name, args in (("plain", ()), ("gelu", ("--epilogue", "bias:0,gelu", "--set", "EP_VALUES=16"))):
        got = _probe("ag_mm_ws", "--json", *args)
        assert got.returncode == 0, got.stderr[-2000:]
        sizes[name] = json.loads(got.stdout.strip().splitlines()[-1])["SASS instructions"]
    assert sizes["plain"] and sizes["gelu"] < 2 * sizes["plain"], sizes


@pytest.mark.parametrize("kernel,args", [
    ("cta_stage1", ("--set", "BN=128", "--set", "SPLIT_K=True", "--stages", "4")),
    ("mm_rs", ("--set", "PEER_STORE=True")),
], ids=["cta_stage1_to_peers", "mm_rs_peer_store"])
def test_tiles_go_to_peer_buffers_in_vectors(kernel, args):
    """The tiles a kernel stores into other ranks' buffers (addresses loaded from the peer table) go in 16-byte
    vectors, not 2 bytes at a time (stage 1's 7 peer copies of a tile were 64 scalar stores a thread each)."""
    got = _probe(kernel, "--json", *args)
    assert got.returncode == 0, got.stderr[-2000:]
    rep = json.loads(got.stdout.strip().splitlines()[-1])
    assert rep["16-bit scalar global stores"] == 0
