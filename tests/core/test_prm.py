"""The call-time ``prm=`` argument: checked and resolved to a process mode in one place."""

import pytest

from lightning_adv import ActorConfig, AdvantageModule, PRMAdvantageShapingConfig
from lightning_adv.stages.process import resolve_process_mode


def process_stage(**actor):
    module = AdvantageModule(ActorConfig(**actor))
    return module.config, module.process


def identity_process(inputs):
    return inputs.advantages


def test_auto_follows_the_call_time_mode_else_additive():
    config, stage = process_stage()
    assert resolve_process_mode(None, config, stage) == ("additive", {})
    prm = PRMAdvantageShapingConfig(mode="gvpo", negative_scale=0.5, zero_penalty=0.3, zero_eps=0.01)
    assert resolve_process_mode(prm, config, stage) == (
        "gvpo", {"negative_scale": 0.5, "zero_penalty": 0.3, "zero_eps": 0.01})
    prm = PRMAdvantageShapingConfig(mode="process_weighted")
    assert resolve_process_mode(prm, config, stage) == ("process_weighted", {})


def test_explicit_stage_beats_the_call_time_mode_and_its_kwargs_win_key_by_key():
    config, stage = process_stage(advantage={"process_adv_shaping": "additive"})
    assert resolve_process_mode(PRMAdvantageShapingConfig(mode="gvpo"), config, stage) == (
        "additive", {})
    config, stage = process_stage(advantage={"process_adv_shaping": {
        "implementation": "gvpo", "kwargs": {"zero_eps": 0.25}}})
    prm = PRMAdvantageShapingConfig(mode="additive", negative_scale=0.7)
    assert resolve_process_mode(prm, config, stage) == (
        "gvpo", {"negative_scale": 0.7, "zero_penalty": 0.4, "zero_eps": 0.25})
    assert resolve_process_mode(None, config, stage) == (
        "gvpo", {"negative_scale": 0.2, "zero_penalty": 0.4, "zero_eps": 0.25})


def test_user_stage_and_full_replacement_run_no_builtin():
    config, stage = process_stage(
        advantage={"process_adv_shaping": "tests.core.test_prm.identity_process"})
    assert resolve_process_mode(PRMAdvantageShapingConfig(mode="gvpo"), config, stage) is None
    assert resolve_process_mode(PRMAdvantageShapingConfig(mode="gvpo"), config, None) is None


def test_bad_prm_is_refused_even_without_a_builtin():
    config, _ = process_stage()
    with pytest.raises(TypeError, match="prm: expected a PRMAdvantageShapingConfig"):
        resolve_process_mode({"mode": "gvpo"}, config, None)
    with pytest.raises(ValueError, match="prm.mode: expected one of"):
        resolve_process_mode(PRMAdvantageShapingConfig(mode="weighted"), config, None)


def test_auto_checks_the_call_time_mode_against_the_config():
    config, stage = process_stage(mask_no_eos_with_zero=True)
    with pytest.raises(ValueError, match="prm.mode: 'process_weighted'.*mask_no_eos_with_zero"):
        resolve_process_mode(PRMAdvantageShapingConfig(mode="process_weighted"), config, stage)
