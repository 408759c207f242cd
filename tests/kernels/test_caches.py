"""The kernels' on-disk caches (generated epilogues, tuned block configs): one root
(``OVERLAP_CACHE_DIR``, ``spec/cache.py``) and keys that follow every knob."""

from __future__ import annotations

import json

import pytest
import torch

from overlap_backend.codegen import configs
from overlap_backend.codegen import epilogue as gen
from overlap_backend.spec import knobs
from overlap_backend.spec.cache import cache_path


@pytest.fixture
def fresh_caches(monkeypatch, tmp_path):
    """Empty in-memory caches, ``$XDG_CACHE_HOME`` pointing at a folder that must stay empty, and a
    GPU name for the tuning key (this machine may have none)."""
    monkeypatch.setattr(gen, "_memory", {})
    monkeypatch.setattr(gen, "_built", {})
    monkeypatch.setattr(configs, "_memory", {})
    monkeypatch.setattr(configs, "_loaded_from", None)
    monkeypatch.setattr(configs, "_device_key", lambda: "NVIDIA H200|triton 0.0")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("OVERLAP_CACHE_DIR", raising=False)
    return monkeypatch


def test_a_changed_knob_changes_the_cache_keys(fresh_caches):
    source, _ = gen.emit("bias:0,gelu", torch.bfloat16)
    epilogue_key, tuning_key = gen.cache_key(source), configs.tuning_key("ag_mm", (4096, 8192))
    with knobs.codegen.patch(TMA_STORE_VARIANTS=knobs.codegen.TMA_STORE_VARIANTS + 1):
        assert gen.cache_key(source) != epilogue_key
        assert configs.tuning_key("ag_mm", (4096, 8192)) != tuning_key
    with knobs.cta.patch(K_CHUNKS=knobs.cta.K_CHUNKS + 1):  # a knob of another set counts as well
        assert gen.cache_key(source) != epilogue_key
        assert configs.tuning_key("ag_mm", (4096, 8192)) != tuning_key
    assert (gen.cache_key(source), configs.tuning_key("ag_mm", (4096, 8192))) == (epilogue_key, tuning_key)


def test_overlap_cache_dir_moves_the_generated_epilogues(fresh_caches, tmp_path):
    monkeypatch = fresh_caches
    for name in ("a", "b"):
        monkeypatch.setenv("OVERLAP_CACHE_DIR", str(tmp_path / name))
        monkeypatch.setattr(gen, "_memory", {})
        monkeypatch.setattr(gen, "_built", {})
        g = gen.build("bias:0,gelu", torch.bfloat16)
        assert g.path.parent == tmp_path / name / "kernels" == cache_path("kernels")
        assert g.path.read_text() == g.source
    assert not (tmp_path / "xdg").exists()


def test_tuning_rounds_keep_a_drifting_clock_off_the_later_candidates(fresh_caches, tmp_path):
    """Under a clock that slows by 10 % per timing, a candidate 5 % faster but timed second loses a single pass
    and wins the rounds (in order, then reversed: the drift falls alike on both)."""
    monkeypatch = fresh_caches
    monkeypatch.setenv("OVERLAP_CACHE_DIR", str(tmp_path))
    first, better = (128, 128, 32, 8, 3, 8, False), (64, 64, 32, 8, 3, 4, False)
    calls = []

    def time_ms(cfg):
        calls.append(cfg)
        return (0.95 if cfg == better else 1.0) * 1.1 ** len(calls)

    with knobs.codegen.patch(AUTOTUNE=True, TUNE_ROUNDS=1):
        assert configs.pick("mm_rs", (2048, 512), [first, better], time_ms) == first
    calls.clear()
    with knobs.codegen.patch(AUTOTUNE=True, TUNE_ROUNDS=2):
        assert configs.pick("mm_rs", (2048, 512), [first, better], time_ms) == better
    assert calls == [first, better, better, first]


def test_overlap_cache_dir_moves_the_tuned_configs(fresh_caches, tmp_path):
    monkeypatch = fresh_caches
    fast, slow = (64, 64, 32, 8, 3, 4, False), (128, 128, 32, 8, 3, 8, False)
    timed = []

    def time_ms(cfg):
        timed.append(cfg)
        return 1.0 if cfg == fast else 2.0

    with knobs.codegen.patch(AUTOTUNE=True):
        for name in ("a", "b"):
            monkeypatch.setenv("OVERLAP_CACHE_DIR", str(tmp_path / name))
            timed.clear()
            assert configs.pick("mm_rs", (1024, 512), [slow, fast], time_ms) == fast
            assert timed == [slow, fast, fast, slow]  # a new root: nothing tuned there yet (two rounds)
            path = tmp_path / name / "autotune" / "tiles.json"
            assert configs.cache_file() == path
            assert json.loads(path.read_text()) == {configs.tuning_key("mm_rs", (1024, 512)): list(fast)}
            timed.clear()
            assert configs.pick("mm_rs", (1024, 512), [slow, fast], time_ms) == fast and timed == []
        with knobs.codegen.patch(TMA_STORE_VARIANTS=0):  # another knob value: tuned again, kept apart
            assert configs.pick("mm_rs", (1024, 512), [slow, fast], time_ms) == fast and timed == [slow, fast, fast, slow]
            assert len(json.loads(path.read_text())) == 2
    assert not (tmp_path / "xdg").exists()
