"""The knobs mechanism: patch restores, bad names and types are refused, the hash follows the values."""

import pytest

from overlap_backend.spec import knobs


def test_patch_changes_and_restores_and_the_hash_follows():
    before, digest = knobs.cta.K_CHUNKS, knobs.knobs_hash()
    with knobs.cta.patch(K_CHUNKS=before + 4):
        assert knobs.cta.K_CHUNKS == before + 4 and knobs.knobs_hash() != digest
    assert knobs.cta.K_CHUNKS == before and knobs.knobs_hash() == digest
    with knobs.patch({"cta.K_CHUNKS": 1, "symm.ONESHOT_MAX_BYTES": 0}):
        assert (knobs.cta.K_CHUNKS, knobs.symm.ONESHOT_MAX_BYTES) == (1, 0)
    assert knobs.cta.K_CHUNKS == before


def test_patch_restores_after_an_exception():
    before = knobs.cta.K_CHUNKS
    with pytest.raises(RuntimeError), knobs.cta.patch(K_CHUNKS=before + 1):
        raise RuntimeError
    assert knobs.cta.K_CHUNKS == before


def test_bad_names_types_and_assignment_are_refused():
    with pytest.raises(KeyError, match="no knob 'NOPE'"), knobs.cta.patch(NOPE=1):
        pass
    with pytest.raises(TypeError, match="cta.K_CHUNKS"), knobs.cta.patch(K_CHUNKS="4"):
        pass
    with pytest.raises(AttributeError, match="patch"):
        knobs.cta.K_CHUNKS = 2
    with pytest.raises(KeyError, match="sets:"):
        knobs.set_from_text("nope.X=1")


def test_set_from_text_parses_literals():
    before = knobs.cta.GELU_SHARE_MAX
    try:
        assert knobs.set_from_text("cta.GELU_SHARE_MAX=0.25") == ("cta.GELU_SHARE_MAX", 0.25)
        assert knobs.cta.GELU_SHARE_MAX == 0.25
    finally:
        knobs.cta.set(GELU_SHARE_MAX=before)


def test_every_set_is_declared_by_importing_the_package():
    assert {"codegen", "cost", "cta", "moe", "passes", "runtime", "symm"} <= set(knobs.knob_sets())
