"""Config validation (SPEC §2): every rule fails when the config is built, naming the key."""

import math

import pytest

from lightning_adv import ActorConfig, AdvantageConfig, AdvantageModule, NormConfig, StageSpec


def adv(**stages):
    return {"advantage": stages}


def test_defaults_match_the_spec():
    c = ActorConfig()
    assert (c.reward_bias, c.reward_scaling, c.reward_clip) == (0.0, 1.0, 20.0)
    assert c.reward_norm is None and c.adv_norm is None
    assert (c.kl_ctl, c.kl_estimator, c.discount, c.gae_lambda) == (0.1, "k1", 1.0, 1.0)
    assert c.gae_lambda_kwargs == {} and c.gae_timestep_unit == "token"
    assert c.mask_no_eos_with_zero is False and c.token_rewards_as_adv is True
    assert (c.overlong_reward_penalty, c.overlong_tokens, c.overlong_penalty_factor,
            c.max_new_tokens) == (False, None, None, 1024)
    assert c.use_decoupled_loss is False and c.recompute_logprob is False
    a = c.advantage
    assert a.compute == StageSpec("default", {}) and a.outcome_reward_shaping is None
    assert a.estimator is None and a.process_adv_shaping is None
    n = NormConfig()
    assert (n.mean_level, n.mean_leave1out, n.std_level, n.std_unbiased, n.eps, n.group_size) == \
        ("batch", False, "batch", True, 1e-5, 1)


def test_every_config_field_has_a_docstring():
    import ast
    import inspect

    import lightning_adv.config as cfg
    tree = ast.parse(inspect.getsource(cfg))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in (
                "ActorConfig", "NormConfig", "AdvantageConfig", "StageSpec",
                "PRMAdvantageShapingConfig"):
            body = node.body
            for i, stmt in enumerate(body):
                if isinstance(stmt, ast.AnnAssign):
                    nxt = body[i + 1] if i + 1 < len(body) else None
                    assert isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant), \
                        f"{node.name}.{stmt.target.id} has no docstring"


def test_nested_mappings_are_converted():
    c = ActorConfig(reward_norm={"mean_level": "group", "std_level": None},
                    advantage={"estimator": {"implementation": "turn_gae"},
                               "process_adv_shaping": "gvpo"})
    assert c.reward_norm == NormConfig(mean_level="group", std_level=None)
    assert c.advantage.estimator == StageSpec("turn_gae")
    assert c.advantage.process_adv_shaping == StageSpec("gvpo")


@pytest.mark.parametrize("kwargs, key, fragment", [
    ({"reward_norm": {"mean_level": "prompt"}}, "actor.reward_norm", "mean_level"),
    ({"adv_norm": {"std_level": "token"}}, "actor.adv_norm", "std_level"),
    ({"adv_norm": {"eps": -1.0}}, "actor.adv_norm", "eps"),
    ({"adv_norm": {"eps": math.nan}}, "actor.adv_norm", "eps"),
    ({"adv_norm": {"group_size": 0}}, "actor.adv_norm", "group_size"),
    ({"adv_norm": {"mean_leave1out": "yes"}}, "actor.adv_norm", "mean_leave1out"),
    ({"reward_norm": {"mean_levle": "group"}}, "actor.reward_norm", "mean_levle"),
    ({"kl_estimator": "k4"}, "actor.kl_estimator", "'k4'"),
    ({"kl_ctl": -0.1}, "actor.kl_ctl", "-0.1"),
    ({"kl_ctl": math.inf}, "actor.kl_ctl", "inf"),
    ({"discount": 1.5}, "actor.discount", "1.5"),
    ({"discount": math.nan}, "actor.discount", "nan"),
    ({"gae_lambda": math.nan}, "actor.gae_lambda", "nan"),
    ({"gae_lambda": -0.5}, "actor.gae_lambda", "-0.5"),
    ({"gae_lambda": "vapo"}, "actor.gae_lambda", "'vapo'"),
    ({"gae_lambda": "lightning_adv.constant_gae_lambda", "gae_lambda_kwargs": {"value": math.nan}},
     "actor.gae_lambda_kwargs", "JSON"),
    ({"gae_lambda": "lightning_adv.constant_gae_lambda", "gae_lambda_kwargs": {"value": (1, 2)}},
     "actor.gae_lambda_kwargs", "JSON"),
    ({"gae_timestep_unit": "step"}, "actor.gae_timestep_unit", "'step'"),
    ({"reward_clip": -1.0}, "actor.reward_clip", "-1.0"),
    ({"reward_scaling": math.inf}, "actor.reward_scaling", "inf"),
    ({"token_rewards_as_adv": 1}, "actor.token_rewards_as_adv", "1"),
    ({"overlong_reward_penalty": True}, "actor.overlong_tokens", "None"),
    ({"overlong_reward_penalty": True, "overlong_tokens": 4}, "actor.overlong_penalty_factor", "None"),
    ({"overlong_reward_penalty": True, "overlong_tokens": 0, "overlong_penalty_factor": 1.0},
     "actor.overlong_tokens", "0"),
    ({"max_new_tokens": 0}, "actor.max_new_tokens", "0"),
    ({"dropped_outcome_reward": "crash"}, "actor.dropped_outcome_reward", "'crash'"),
    (adv(compute={"implementation": "default", "kwargs": {"x": 1}}), "actor.advantage.compute",
     "no kwargs"),
    (adv(compute="my_pkg.my_mod.compute", estimator="token_gae"), "actor.advantage.compute",
     "cannot be combined"),
    (adv(process_adv_shaping={"implementation": "auto", "kwargs": {"zero_penalty": 0.1}}),
     "actor.advantage.process_adv_shaping", "no kwargs"),
    (adv(outcome_reward_shaping={"implementation": "auto", "kwargs": {"factor": 2}}),
     "actor.advantage.outcome_reward_shaping", "no kwargs"),
    (adv(outcome_reward_shaping={"implementation": "identity", "kwargs": {"factor": 2}}),
     "actor.advantage.outcome_reward_shaping", "no kwargs"),
    (adv(estimator={"implementation": "token_gae", "kwargs": {"lam": 0.9}}),
     "actor.advantage.estimator", "no kwargs"),
    (adv(estimator={"implementation": "turn_gae", "kwargs": {"lam": 0.9}}),
     "actor.advantage.estimator", "no kwargs"),
    (adv(estimator="tokengae"), "actor.advantage.estimator", "'tokengae'"),
    (adv(outcome_reward_shaping="scale"), "actor.advantage.outcome_reward_shaping", "'scale'"),
    (adv(process_adv_shaping="weighted"), "actor.advantage.process_adv_shaping", "'weighted'"),
    (adv(process_adv_shaping={"implementation": "additive", "kwargs": {"scale": 1}}),
     "actor.advantage.process_adv_shaping", "no kwargs"),
    (adv(process_adv_shaping={"implementation": "gvpo", "kwargs": {"negative": 0.1}}),
     "actor.advantage.process_adv_shaping", "negative"),
    (adv(process_adv_shaping={"implementation": "gvpo", "kwargs": {"zero_penalty": -0.1}}),
     "actor.advantage.process_adv_shaping.kwargs.zero_penalty", "-0.1"),
    (adv(process_adv_shaping={"implementation": "gvpo", "kwargs": {"zero_eps": math.inf}}),
     "actor.advantage.process_adv_shaping", "JSON"),
    (adv(process_adv_shaping={"implementation": "gvpo", "kwargs": {"negative_scale": True}}),
     "actor.advantage.process_adv_shaping.kwargs.negative_scale", "True"),
    (adv(estimator={"implementation": "my.est", "kwargs": {"when": object()}}),
     "actor.advantage.estimator", "JSON"),
    (adv(estimator={"implementation": "my.est", "extra": 1}), "actor.advantage.estimator", "extra"),
    (adv(estimator={"implementation": ""}), "actor.advantage.estimator", "non-empty"),
    ({"token_rewards_as_adv": False, **adv(process_adv_shaping="gvpo")},
     "actor.advantage.process_adv_shaping", "token_rewards_as_adv"),
    ({"token_rewards_as_adv": False, **adv(process_adv_shaping="process_weighted")},
     "actor.advantage.process_adv_shaping", "token_rewards_as_adv"),
    ({"mask_no_eos_with_zero": True, **adv(process_adv_shaping="process_weighted")},
     "actor.advantage.process_adv_shaping", "mask_no_eos_with_zero"),
])
def test_bad_config_names_the_key_and_value(kwargs, key, fragment):
    with pytest.raises(ValueError) as err:
        ActorConfig(**kwargs)
    message = str(err.value)
    assert key in message and fragment in message, message


def test_gvpo_kwargs_accepted_when_valid():
    c = ActorConfig(advantage={"process_adv_shaping": {
        "implementation": "gvpo", "kwargs": {"negative_scale": 0.5, "zero_penalty": 0, "zero_eps": 0.1}}})
    assert c.advantage.process_adv_shaping.kwargs["zero_penalty"] == 0


def test_turn_estimator_with_token_unit_is_allowed():
    c = ActorConfig(advantage={"estimator": "turn_gae"})
    assert c.estimator_unit == "turn" and c.gae_timestep_unit == "token"


def test_standalone_configs_validate_too():
    with pytest.raises(ValueError, match=r"NormConfig\.mean_level"):
        NormConfig(mean_level="everything")
    with pytest.raises(ValueError, match=r"advantage\.estimator"):
        AdvantageConfig(estimator=StageSpec("lambda_return"))
    with pytest.raises(ValueError, match="JSON"):
        StageSpec("my.fn", {"x": {1, 2}})


def test_configs_are_frozen_and_hold_json():
    import dataclasses
    import json
    c = ActorConfig(advantage={"process_adv_shaping": {"implementation": "gvpo",
                                                       "kwargs": {"negative_scale": 0.3}}})
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.kl_ctl = 0.0
    json.dumps(dataclasses.asdict(c))


# ---------------------------------------------------------------- resolution at build time

def unary(inputs, *, factor: float):
    return inputs


def no_kwargs(inputs):
    return inputs


NOT_CALLABLE = 3


@pytest.mark.parametrize("stage, impl, kwargs, fragment", [
    ("estimator", "no_such_pkg.mod.fn", {}, "cannot import"),
    ("estimator", "tests_missing.fn", {}, "cannot import"),
    ("outcome_reward_shaping", "tests.core.test_config.missing_fn", {}, "has no attribute 'missing_fn'"),
    ("outcome_reward_shaping", "tests.core.test_config.NOT_CALLABLE", {}, "not a callable"),
    ("outcome_reward_shaping", "tests.core.test_config.unary", {"scale": 2}, "does not accept kwargs ['scale']"),
    ("outcome_reward_shaping", "tests.core.test_config.unary", {}, "missing a required"),
    ("process_adv_shaping", "tests.core.test_config.no_kwargs", {"x": 1}, "does not accept kwargs ['x']"),
])
def test_stage_paths_resolve_when_the_module_is_built(stage, impl, kwargs, fragment):
    config = ActorConfig(advantage={stage: {"implementation": impl, "kwargs": kwargs}})
    with pytest.raises(ValueError) as err:
        AdvantageModule(config)
    message = str(err.value)
    assert f"actor.advantage.{stage}" in message and impl in message and fragment in message, message


def test_lambda_path_resolves_when_the_module_is_built():
    with pytest.raises(ValueError, match=r"actor\.gae_lambda.*no_such_pkg"):
        AdvantageModule(ActorConfig(gae_lambda="no_such_pkg.lam"))
    with pytest.raises(ValueError, match=r"actor\.gae_lambda.*does not accept kwargs \['beta'\]"):
        AdvantageModule(ActorConfig(gae_lambda="lightning_adv.vapo_length_adaptive_gae",
                                    gae_lambda_kwargs={"beta": 1.0}))
    AdvantageModule(ActorConfig(gae_lambda="lightning_adv.vapo_length_adaptive_gae",
                                gae_lambda_kwargs={"alpha": 1.0}))


def test_module_repr_shows_the_pipeline():
    module = AdvantageModule(ActorConfig(
        gae_timestep_unit="turn",
        advantage={"process_adv_shaping": {"implementation": "gvpo", "kwargs": {"zero_eps": 0.01}}}))
    text = repr(module)
    assert "(outcome): Stage(identity)" in text
    assert "(estimator): Stage(turn_gae)" in text
    assert "(process): Stage(gvpo(zero_eps=0.01))" in text


def test_one_registry_names_every_builtin():
    # One list of built-ins: the config accepts exactly the registered names (plus each
    # family's selector), each names a function of that name whose keyword parameters
    # are exactly the kwargs the table declares (the config checks kwargs by the table).
    import inspect

    from lightning_adv.stages.registry import SELECTORS, builtin_names, builtin_stage
    expected = {
        "compute": {"default"},
        "outcome_reward_shaping": {"auto", "identity", "opo_baseline", "gpg", "passk_baseline",
                                   "group_mean_batch_std", "sequence_kl", "remax_baseline",
                                   "maxrl"},
        "estimator": {"auto", "token_gae", "turn_gae", "reinforce", "optimal_token_baseline",
                      "tir_optimal_token_baseline", "turn_rloo", "turn_index_norm", "gigpo",
                      "vine", "tree_grpo", "treepo", "treerl"},
        "process_adv_shaping": {"auto", "additive", "gvpo", "process_weighted",
                                "top_entropy_mask", "gtpo"},
    }
    for family, names in expected.items():
        assert set(builtin_names(family)) == names, family
        for name in names - {SELECTORS[family]}:
            entry = builtin_stage(family, name)
            assert entry.fn.__name__ == name
            keywords = list(inspect.signature(entry.fn).parameters)[1:]
            assert sorted(keywords) == sorted(entry.kwarg_checks), (family, name)
            spec = {"implementation": name}
            if family != "compute":
                ActorConfig(advantage={family: spec})  # accepted by the config


def test_registering_a_named_stage_is_one_decorated_function():
    from lightning_adv.stages.registry import register_stage, unregister_stage
    from lightning_adv._checks import positive_number

    @register_stage("outcome_reward_shaping", kwarg_checks={"factor": positive_number})
    def scaled_for_test(inputs, *, factor: float = 1.0):
        return inputs
    try:
        c = ActorConfig(advantage={"outcome_reward_shaping": {
            "implementation": "scaled_for_test", "kwargs": {"factor": 2.0}}})
        assert AdvantageModule(c).outcome.fn is scaled_for_test
        with pytest.raises(ValueError, match=r"outcome_reward_shaping\.kwargs\.factor: expected a number > 0"):
            ActorConfig(advantage={"outcome_reward_shaping": {
                "implementation": "scaled_for_test", "kwargs": {"factor": 0}}})
        with pytest.raises(ValueError, match=r"does not accept kwargs \['scale'\] \(it takes only \['factor'\]\)"):
            ActorConfig(advantage={"outcome_reward_shaping": {
                "implementation": "scaled_for_test", "kwargs": {"scale": 2}}})
        with pytest.raises(ValueError, match="already registered"):
            register_stage("outcome_reward_shaping", "scaled_for_test")(lambda inputs: inputs)
        with pytest.raises(ValueError, match="does not take"):
            register_stage("estimator", kwarg_checks={"x": positive_number})(lambda inputs: inputs)
    finally:
        unregister_stage("outcome_reward_shaping", "scaled_for_test")
