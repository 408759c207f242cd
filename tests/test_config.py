"""Config parsing, precedence, bad values, OVERLAP_DISABLE and backend registration."""

import importlib.metadata
import logging

import pytest
import torch

import overlap_backend
from overlap_backend import ConfigError, OverlapConfig, make_backend


def test_defaults(clean_env):
    cfg = OverlapConfig.from_env()
    assert cfg == OverlapConfig()
    assert cfg.passes == ("ag_mm", "mm_rs", "moe_tp_experts", "mm_ar", "moe")
    assert cfg.lowering == "auto" and cfg.inductor and not cfg.disable and cfg.debug_dir is None


def test_every_field_has_an_env_var():
    import dataclasses

    fields = {f.name for f in dataclasses.fields(OverlapConfig)}
    env = OverlapConfig.env_vars()
    assert set(env) == fields
    assert all(v.startswith("OVERLAP_") for v in env.values())


def test_env_values_parsed(clean_env, tmp_path):
    clean_env.setenv("OVERLAP_DISABLE", "1")
    clean_env.setenv("OVERLAP_PASSES", "mm_rs, ag_mm")
    clean_env.setenv("OVERLAP_LOWERING", "P2P")
    clean_env.setenv("OVERLAP_INDUCTOR", "0")
    clean_env.setenv("OVERLAP_DEBUG_DIR", str(tmp_path))
    clean_env.setenv("OVERLAP_MIN_NUMEL", "4096")
    cfg = OverlapConfig.from_env()
    # passes run in the manager's order, whatever order they were listed in
    assert cfg == OverlapConfig(True, ("ag_mm", "mm_rs"), "p2p", False, str(tmp_path), 4096)


def test_explicit_argument_beats_env(clean_env):
    clean_env.setenv("OVERLAP_PASSES", "ag_mm")
    clean_env.setenv("OVERLAP_INDUCTOR", "0")
    backend = make_backend(passes=["mm_ar"])
    assert backend.config.passes == ("mm_ar",)
    assert backend.config.inductor is False  # from the environment
    explicit = make_backend(OverlapConfig(), passes="mm_rs")
    assert explicit.config.passes == ("mm_rs",) and explicit.config.inductor is True


@pytest.mark.parametrize(
    "var, value, allowed",
    [
        ("OVERLAP_DISABLE", "maybe", "allowed: 1, 0"),
        ("OVERLAP_INDUCTOR", "2", "allowed: 1, 0"),
        ("OVERLAP_PASSES", "ag_mm,bogus", "allowed: ag_mm, mm_rs, cta_pipeline, moe_tp_experts, mm_ar, moe"),
        ("OVERLAP_CTA_STAGES", "0", "allowed: an integer >= 1"),
        ("OVERLAP_CTA_STAGES", "two", "allowed: an integer >= 1"),
        ("OVERLAP_LOWERING", "nvshmem", "allowed: auto, symm, p2p"),
        ("OVERLAP_MIN_NUMEL", "-3", "allowed: an integer >= 0"),
        ("OVERLAP_MIN_NUMEL", "lots", "allowed: an integer >= 0"),
    ],
)
def test_bad_env_value_names_variable_and_allowed(clean_env, var, value, allowed):
    clean_env.setenv(var, value)
    with pytest.raises(ConfigError) as err:
        OverlapConfig.from_env()
    assert var in str(err.value) and allowed in str(err.value)


def test_bad_override_names_option():
    with pytest.raises(ConfigError, match="unknown option 'pases'"):
        make_backend(pases=["ag_mm"])
    with pytest.raises(ConfigError, match="lowering"):
        make_backend(lowering="fast")


def test_symm_accepted_and_timeout_parsed(clean_env):
    assert make_backend(lowering="symm").config.lowering == "symm"
    clean_env.setenv("OVERLAP_TIMEOUT_S", "2.5")
    assert OverlapConfig.from_env().timeout_s == 2.5
    for bad in ("0", "-1", "inf", "soon"):
        clean_env.setenv("OVERLAP_TIMEOUT_S", bad)
        with pytest.raises(ConfigError, match="OVERLAP_TIMEOUT_S"):
            OverlapConfig.from_env()


def test_backend_registered_by_name_and_entry_point():
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("overlap") is overlap_backend.overlap
    eps = importlib.metadata.entry_points(group="torch_dynamo_backends")
    assert any(ep.name == "overlap" and ep.value == "overlap_backend.backend:overlap" for ep in eps)


def test_disable_is_plain_inductor(clean_env, monkeypatch):
    """OVERLAP_DISABLE=1 hands the graph to compile_fx untouched: no patches, no pipeline."""
    import torch._inductor.compile_fx as cfx

    calls = []

    def spy(gm, example_inputs, **kwargs):
        calls.append(kwargs)
        return gm.forward

    monkeypatch.setattr(cfx, "compile_fx", spy)
    clean_env.setenv("OVERLAP_DISABLE", "1")
    torch._dynamo.reset()
    backend = make_backend()
    fn = torch.compile(lambda x: torch.relu(x) + 1, backend=backend)
    x = torch.randn(8)
    torch.testing.assert_close(fn(x), torch.relu(x) + 1)
    assert calls == [{}] and backend.reports == []
    torch._dynamo.reset()


def test_direct_config_validated():
    with pytest.raises(ConfigError, match="lowering='xyz'"):
        OverlapConfig(lowering="xyz")
    with pytest.raises(ConfigError, match="unknown pass"):
        OverlapConfig(passes=("ag_mm", "bogus"))
    with pytest.raises(ConfigError, match="min_numel"):
        make_backend(min_numel=2.5)


def test_cta_pipeline_registered_but_off_by_default(clean_env):
    assert "cta_pipeline" not in OverlapConfig().passes
    assert OverlapConfig.from_env().cta_stages == 2
    clean_env.setenv("OVERLAP_PASSES", "default")
    assert OverlapConfig.from_env().passes == ("ag_mm", "mm_rs", "moe_tp_experts", "mm_ar", "moe")
    clean_env.setenv("OVERLAP_PASSES", "mm_ar,cta_pipeline")
    clean_env.setenv("OVERLAP_CTA_STAGES", "4")
    cfg = OverlapConfig.from_env()
    # cta_pipeline runs before mm_ar, which would otherwise claim the MLP's mm -> all_reduce tail
    assert cfg.passes == ("cta_pipeline", "mm_ar") and cfg.cta_stages == 4
    assert make_backend(passes=["cta_pipeline"], cta_stages=3).config.cta_stages == 3
    clean_env.setenv("OVERLAP_PASSES", "all")
    assert "cta_pipeline" in OverlapConfig.from_env().passes
    with pytest.raises(ConfigError, match="cta_stages"):
        OverlapConfig(cta_stages=0)


def test_moe_comm_sms(clean_env):
    """OVERLAP_MOE_COMM_SMS: default 0 (no comm kernel), 0..64, read by the moe symm lowering per call."""
    from overlap_backend.runtime import moe_symm

    assert OverlapConfig.from_env().moe_comm_sms == 0 and moe_symm.comm_sms() == 0
    clean_env.setenv("OVERLAP_MOE_COMM_SMS", "16")
    assert OverlapConfig.from_env().moe_comm_sms == 16 and moe_symm.comm_sms() == 16
    assert make_backend(moe_comm_sms=4).config.moe_comm_sms == 4
    clean_env.setenv("OVERLAP_MOE_COMM_SMS", "0")
    assert OverlapConfig.from_env().moe_comm_sms == 0 and moe_symm.comm_sms() == 0
    for bad in ("-1", "65", "x", "2.5"):
        clean_env.setenv("OVERLAP_MOE_COMM_SMS", bad)
        with pytest.raises(ConfigError, match="OVERLAP_MOE_COMM_SMS"):
            OverlapConfig.from_env()
        with pytest.raises(ConfigError, match="OVERLAP_MOE_COMM_SMS"):
            moe_symm.comm_sms()
    with pytest.raises(ConfigError, match="moe_comm_sms"):
        OverlapConfig(moe_comm_sms=-1)


def test_pass_names_are_the_registry_in_run_order():
    """config.py names the passes without importing them (it sits below every pass): the names and
    their order must be the pass manager's registry."""
    from overlap_backend import config
    from overlap_backend.passes import available_passes

    assert config.PASS_NAMES == available_passes()
    assert set(config.DEFAULT_PASS_ORDER) <= set(config.PASS_NAMES)


@pytest.mark.parametrize("value", ["0.0005", "1e-4", "9.3e9", "1e300"])
def test_timeout_outside_what_the_transports_honour_is_a_config_error(clean_env, value):
    """Below 1 ms torch rounds the wait's timedelta to 0 ms, which means "no timeout"; above what a
    symm kernel's int64 nanosecond bound (and timedelta) can hold the first op would overflow."""
    clean_env.setenv("OVERLAP_TIMEOUT_S", value)
    with pytest.raises(ConfigError) as err:
        OverlapConfig.from_env()
    assert "OVERLAP_TIMEOUT_S" in str(err.value) and "from 0.001 to 9.2e+09" in str(err.value)
    with pytest.raises(ConfigError, match="timeout_s"):
        OverlapConfig(timeout_s=float(value))


def test_timeout_bounds_are_accepted_and_representable(clean_env):
    from datetime import timedelta

    for value in ("0.001", "9.2e9"):
        clean_env.setenv("OVERLAP_TIMEOUT_S", value)
        seconds = OverlapConfig.from_env().timeout_s
        assert seconds == float(value)
        assert timedelta(seconds=seconds) // timedelta(milliseconds=1) >= 1  # not rounded to "no timeout"
        assert int(seconds * 1e9) < 2**63  # the symm kernels' timeout_ns argument


def test_an_unknown_overlap_variable_is_warned_about_once_with_the_closest_name(clean_env, caplog):
    from overlap_backend import config

    clean_env.setattr(config, "_warned_unknown", set())
    env = {"OVERLAP_LOWERNG": "p2p", "OVERLAP_TEST_SHARED_GPU": "1", "OVERLAP_LOWERING": "p2p", "OVERLAP_": "x"}
    with caplog.at_level(logging.WARNING, logger="overlap_backend"):
        assert OverlapConfig.from_env(env).lowering == "p2p"
        OverlapConfig.from_env(env)  # the second compile of a process says nothing new
    warned = [r.getMessage() for r in caplog.records if r.name == "overlap_backend"]
    assert len(warned) == 2, warned
    typo = next(m for m in warned if m.startswith("OVERLAP_LOWERNG is set"))
    assert "did you mean OVERLAP_LOWERING?" in typo and "OVERLAP_TIMEOUT_S" in typo, typo
    assert any(m.startswith("OVERLAP_ is set") and "did you mean" not in m for m in warned), warned
    assert config.unknown_variables({v: "1" for v in config.known_variables()}) == []
