"""Inputs that used to give silent wrong numbers: each is now refused, or warned about with
a named warning category (the legacy numbers kept), and each test first shows the bad input.

Singleton groups under group normalization, a KL penalty without a reference, misspelt
batch keys, log-probs above 0, per-row lambdas outside [0, 1], kernel arguments out of
range, degenerate reward settings and settings that have no effect.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.batches import rows_batch
from lightning_adv import (
    ActorConfig, AdvantageModule, BatchMeta, NormConfig, RolloutGroup, compute_token_gae,
    compute_turn_gae, concat_batch)
from lightning_adv.batch.validation import LOGP_TOLERANCE
from lightning_adv.exceptions import LogProbRangeWarning, UnknownBatchKeyWarning
from lightning_adv.exceptions import IgnoredSettingWarning
from lightning_adv.ops.gae import compute_token_gae as token_gae
from lightning_adv.exceptions import SingletonGroupWarning
from lightning_adv.exceptions import MissingRefLogpWarning

GROUP = {"mean_level": "group", "std_level": "group"}
NO_KL = {"kl_ctl": 0.0}


def close(got, want):
    torch.testing.assert_close(got.double(), torch.as_tensor(want, dtype=torch.float64),
                               rtol=1e-6, atol=1e-6)


def two_rows(**extra):
    return rows_batch(["pgg.", "pggg"], [1.0, 0.0], **extra)


def caught(fn, *args, **kwargs):
    """fn's result and the warnings it emitted (all of them, even repeated ones)."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    return result, record


def of(record, category):
    return [str(w.message) for w in record if issubclass(w.category, category)]


def quiet(fn, *args, **kwargs):
    """fn's result; any warning fails the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn(*args, **kwargs)


# ------------------------------------------------------------------ singleton groups

def test_group_norm_without_meta_zeroes_every_advantage_and_warns():
    # GRPO called without meta: group_size 1 makes every row its own group.
    module = AdvantageModule(ActorConfig(reward_norm=GROUP, **NO_KL))
    out, record = caught(module, two_rows())
    close(out["advantages"], torch.zeros(2, 4))  # the legacy numbers are kept
    [message] = of(record, SingletonGroupWarning)
    assert "actor.reward_norm" in message and "group_size 1 and no meta" in message
    assert "every reward is normalized to 0" in message and "actor.singleton_groups" in message


def test_meta_with_one_member_per_group_warns_and_can_raise():
    batch, meta = two_rows(), BatchMeta(2, [1, 1])
    _, record = caught(AdvantageModule(ActorConfig(reward_norm=GROUP, **NO_KL)), batch, meta)
    [message] = of(record, SingletonGroupWarning)
    assert "member counts [1, 1]" in message
    with pytest.raises(ValueError, match=r"actor\.reward_norm: every group has one member"):
        AdvantageModule(ActorConfig(reward_norm=GROUP, singleton_groups="raise", **NO_KL))(
            batch, meta)
    quiet(AdvantageModule(ActorConfig(reward_norm=GROUP, singleton_groups="ignore", **NO_KL)),
          batch, meta)


def test_rollout_groups_count_logical_rollouts():
    # Two rows of one logical rollout per prompt: one member, although each prompt has two rows.
    prompt = {**rows_batch(["pg.", "pg."], [1.0, 1.0]), "rollout_group": RolloutGroup((2,))}
    batch, meta = concat_batch([prompt, dict(prompt)])
    config = ActorConfig(reward_norm={"mean_level": "group", "mean_leave1out": True,
                                      "std_level": None}, **NO_KL)
    out, record = caught(AdvantageModule(config), batch, meta)
    close(out["advantages"], torch.zeros(4, 3))
    [message] = of(record, SingletonGroupWarning)
    assert "member counts [1, 1]" in message and "mean_level normalize" in message


def test_adv_norm_singleton_groups_warn_with_their_key():
    config = ActorConfig(adv_norm=GROUP, **NO_KL)
    _, record = caught(AdvantageModule(config), two_rows(), BatchMeta(2, [1, 1]))
    [message] = of(record, SingletonGroupWarning)
    assert message.startswith("actor.adv_norm:") and "own tokens" in message


@pytest.mark.parametrize("meta, norm", [
    (BatchMeta(1, [2]), GROUP),                            # a real group of two
    (BatchMeta(1, [2]), {"mean_level": "group", "mean_leave1out": True, "std_level": None}),
    (None, {"mean_level": "batch", "std_level": "batch"}),  # no group level
    (None, {**GROUP, "group_size": 2}),
])
def test_groups_with_several_members_do_not_warn(meta, norm):
    quiet(AdvantageModule(ActorConfig(reward_norm=norm, adv_norm=norm, **NO_KL)), two_rows(), meta)


def test_some_singleton_groups_among_others_do_not_warn():
    batch = rows_batch(["pg.", "pg.", "pg."], [1.0, 0.0, 1.0])
    out = quiet(AdvantageModule(ActorConfig(reward_norm=GROUP, **NO_KL)), batch, BatchMeta(2, [2, 1]))
    assert out["advantages"][0, 0] > 0 > out["advantages"][1, 0]
    assert out["advantages"][2, 0] == 0  # a filtered prompt with one sample: 0, as before


# ------------------------------------------------------------------ KL without a reference

def test_kl_without_ref_logp_warns_once_per_module_and_keeps_the_legacy_numbers():
    batch = rows_batch(["pgg."], [0.0], logprobs=[[0.0, -1.0, -2.0, 0.0]])
    module = AdvantageModule(ActorConfig(kl_ctl=0.1))
    out, first = caught(module, batch)
    _, second = caught(module, batch)
    close(out["kl_rewards"], [[0.1, 0.2, 0, 0]])  # KL against log-prob 0, as the legacy code
    [message] = of(first, MissingRefLogpWarning)
    assert "actor.kl_ctl=0.1" in message and "no 'ref_logp'" in message
    assert "actor.missing_ref_logp" in message
    assert not of(second, MissingRefLogpWarning)
    # A trainer's KL controller replaces the config with a new kl_ctl every step: still once.
    module.config = dataclasses.replace(module.config, kl_ctl=0.2)
    assert not of(caught(module, batch)[1], MissingRefLogpWarning)


def test_kl_without_ref_logp_can_raise_or_be_ignored():
    with pytest.raises(ValueError, match=r"actor\.kl_ctl=0\.1 but the rollout batch has no 'ref_logp'"):
        AdvantageModule(ActorConfig(missing_ref_logp="raise"))(two_rows())
    quiet(AdvantageModule(ActorConfig(missing_ref_logp="ignore")), two_rows())
    quiet(AdvantageModule(ActorConfig(kl_ctl=0.0, missing_ref_logp="raise")), two_rows())
    quiet(AdvantageModule(ActorConfig(missing_ref_logp="raise")), two_rows(ref_logp=torch.zeros(2, 4)))


def test_a_misspelt_ref_logp_is_named_in_both_warnings():
    batch = two_rows(ref_logprobs=torch.full((2, 4), -1.0))
    out, record = caught(AdvantageModule(ActorConfig()), batch)
    assert "'ref_logprobs'" in of(record, MissingRefLogpWarning)[0]
    [unknown] = of(record, UnknownBatchKeyWarning)
    assert "'ref_logprobs' (did you mean 'ref_logp'?)" in unknown
    assert out["ref_logprobs"] is batch["ref_logprobs"]  # still passed through


# ------------------------------------------------------------------ batch keys

def test_misspelt_optional_keys_are_reported_with_the_closest_known_key():
    _, record = caught(AdvantageModule(ActorConfig(**NO_KL)),
                       two_rows(token_reward=torch.ones(2, 4), value=torch.zeros(2, 4)))
    [message] = of(record, UnknownBatchKeyWarning)
    assert "'token_reward' (did you mean 'token_rewards'?)" in message
    assert "'value' (did you mean 'values'?)" in message


def test_callers_own_keys_pass_silently():
    # Unrelated names, and a near miss of a key the batch does carry, are the caller's own.
    batch = two_rows(my_scores=torch.ones(2), values=torch.zeros(2, 4), value=torch.ones(2, 4),
                     old_logprobs=torch.zeros(2, 4))
    out = quiet(AdvantageModule(ActorConfig(**NO_KL)), batch)
    assert out["my_scores"] is batch["my_scores"] and out["value"] is batch["value"]


def test_a_missing_required_key_names_its_near_miss():
    batch = two_rows()
    batch["reward"] = batch.pop("rewards")
    with pytest.raises(ValueError, match=r"no 'rewards' .*the batch has 'reward' for 'rewards'"):
        AdvantageModule(ActorConfig())(batch)


# ------------------------------------------------------------------ log-prob ranges

def test_probabilities_as_logprobs_are_refused():
    probabilities = torch.tensor([[0.0, 0.7, 0.2, 0.0], [0.0, 0.9, 0.5, 0.4]])
    with pytest.raises(ValueError, match=r"'logprobs': expected log-probabilities .*generated "
                                         r"tokens, got 5 values above that \(first at \(0, 1\): 0\.7\)"):
        AdvantageModule(ActorConfig(**NO_KL))(two_rows(logprobs=probabilities))


def test_logprobs_may_hold_anything_finite_off_the_generated_tokens_and_round_slightly():
    junk = torch.tensor([[9.0, -0.5, LOGP_TOLERANCE, 3.0], [4.5, -1.0, -2.0, -3.0]])
    out = quiet(AdvantageModule(ActorConfig(kl_ctl=1.0)), two_rows(logprobs=junk, ref_logp=torch.zeros(2, 4)))
    close(out["logprobs"], [[-0.5, LOGP_TOLERANCE, 0, 0], [-1, -2, -3, 0]])


@pytest.mark.parametrize("value", [-math.inf, math.inf, math.nan])
def test_non_finite_logprobs_are_still_refused(value):
    logprobs = torch.zeros(2, 4)
    logprobs[1, 0] = value  # off the mask: still an error (a NaN is never a log-prob)
    with pytest.raises(ValueError, match=r"'logprobs': expected finite values.*\(1, 0\)"):
        AdvantageModule(ActorConfig())(two_rows(logprobs=logprobs))


@pytest.mark.parametrize("key", ["ref_logp", "prox_logp"])
def test_positive_ref_and_prox_logp_warn_and_can_raise(key):
    # next-token convention: position 0 predicts row 0's first generated token
    x = torch.zeros(2, 4)
    x[0, 0] = 0.75
    _, record = caught(AdvantageModule(ActorConfig(**NO_KL)), two_rows(**{key: x}))
    [message] = of(record, LogProbRangeWarning)
    assert f"'{key}'" in message and "(first at (0, 0): 0.75)" in message
    with pytest.raises(ValueError, match=f"'{key}': expected log-probabilities"):
        AdvantageModule(ActorConfig(positive_ref_prox_logp="raise", **NO_KL))(two_rows(**{key: x}))
    quiet(AdvantageModule(ActorConfig(positive_ref_prox_logp="ignore", **NO_KL)), two_rows(**{key: x}))
    # Position 2 of row 0 predicts padding: never read, so anything finite is fine there.
    x = torch.zeros(2, 4)
    x[0, 2] = 5.0
    quiet(AdvantageModule(ActorConfig(positive_ref_prox_logp="raise", **NO_KL)), two_rows(**{key: x}))


# ------------------------------------------------------------------ lambda functions

def _lambda_returning(values):
    import lightning_adv.stages.gae_lambda as lambdas

    def fn(context):
        n = context.timestep_lengths.shape[0]
        return torch.full((n,), values) if n != 2 else torch.tensor([0.5, values])
    lambdas.out_of_range_for_test = fn
    return "lightning_adv.stages.gae_lambda.out_of_range_for_test"


@pytest.mark.parametrize("value", [1.5, 1000.0, -0.5])
def test_lambda_functions_outside_zero_one_are_refused(value):
    path = _lambda_returning(value)
    # The probe call at construction (4 rows) already sees it.
    with pytest.raises(ValueError, match=r"actor\.gae_lambda 'lightning_adv\.stages\.gae_lambda\."
                                         r"out_of_range_for_test'.*outside \[0, 1\]"):
        AdvantageModule(ActorConfig(gae_lambda=path))


def test_lambda_outside_zero_one_on_a_real_batch_names_the_rows():
    import lightning_adv.stages.gae_lambda as lambdas
    # Fine on the probe (lengths 0, 1, 2, 7), above 1 for a row of three generated tokens.
    lambdas.long_rows_for_test = lambda context: torch.where(
        context.timestep_lengths == 3, 1.5, 0.5)
    module = AdvantageModule(ActorConfig(gae_lambda="lightning_adv.stages.gae_lambda.long_rows_for_test",
                                         **NO_KL))
    with pytest.raises(ValueError, match=r"long_rows_for_test'.*outside \[0, 1\] \(rows \[1\]: \[1\.5\]\)"):
        module(two_rows())


# ------------------------------------------------------------------ kernels

def kernel(fn, mask=None, discount=1.0, gae_lambda=0.9):
    r, v = torch.ones(2, 4), torch.zeros(2, 4)
    m = torch.tensor([[1.0, 1, 0, 0], [1, 1, 1, 0]]) if mask is None else mask
    kwargs = dict(bootstrap_values=torch.zeros(2), discount=discount, gae_lambda=gae_lambda)
    if fn == "token":
        return compute_token_gae(r, v, m, **kwargs)
    return compute_turn_gae(r, v, m, torch.zeros(2, 4, dtype=torch.long), **kwargs)


@pytest.mark.parametrize("fn", ["token", "turn"])
@pytest.mark.parametrize("arguments, message", [
    ({"discount": 2.0}, r"discount must be a number in \[0, 1\], got 2\.0"),
    ({"discount": -0.1}, r"discount must be a number in \[0, 1\], got -0\.1"),
    ({"discount": math.nan}, r"discount must be a number in \[0, 1\], got nan"),
    ({"discount": True}, r"discount must be a number"),
    ({"gae_lambda": 1.5}, r"gae_lambda must be a number in \[0, 1\] or a \[B\] tensor"),
    ({"gae_lambda": math.nan}, r"gae_lambda must be a number in \[0, 1\].*nan"),
    ({"gae_lambda": torch.tensor([0.5, 1.5])}, r"gae_lambda tensor entries .*\[0, 1\].*max 1\.5"),
    ({"gae_lambda": torch.tensor([0.5, math.nan])}, r"gae_lambda tensor entries .*nan"),
    ({"mask": torch.full((2, 4), 3.0)}, r"loss_mask must hold only 0 and 1, got \[3\.0\]"),
    ({"mask": torch.tensor([[1.0, 0.5, 0, 0], [1, 1, 1, 0]])}, r"loss_mask .*got \[0\.5\]"),
    ({"mask": torch.tensor([[1.0, -1, 0, 0], [1, 1, 1, 0]])}, r"loss_mask .*got \[-1\.0\]"),
    ({"mask": torch.tensor([[1, 2, 0, 0], [1, 1, 1, 0]])}, r"loss_mask .*got \[2\]"),
])
def test_kernel_argument_values_are_checked(fn, arguments, message):
    name = "compute_token_gae" if fn == "token" else "compute_turn_gae"
    with pytest.raises(ValueError, match=f"{name}: {message}"):
        kernel(fn, **arguments)


MASK_VALUES = [0.0, 1.0, 0.5, 1 - 2**-24, 2**-126, 1e-45, 2.0, -1.0, 1e30, math.inf, math.nan]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(MASK_VALUES), min_size=1, max_size=12),
       st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]))
def test_the_mask_check_refuses_exactly_the_masks_with_a_value_other_than_0_and_1(values, dtype):
    mask = torch.tensor([values], dtype=torch.float64).to(dtype)
    # What the dtype actually holds (bf16 rounds 1 - 2**-24 to 1, 1e-45 to 0, ...).
    held = mask.double()[0].tolist()
    binary = all(v in (0.0, 1.0) for v in held)
    try:
        zeros = torch.zeros(mask.shape)
        token_gae(zeros, zeros, mask, bootstrap_values=zeros[:, 0], discount=1.0, gae_lambda=1.0)
        accepted = True
    except ValueError:
        accepted = False
    assert accepted == binary, (held, dtype)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from([-3.0, -1e-4, 0.0, 5e-4, 2e-3, 0.5, 9.0])),
                min_size=3, max_size=3))
def test_logprobs_are_refused_exactly_when_a_generated_token_exceeds_the_tolerance(cells):
    loss_mask = [[0] + [int(generated) for generated, _ in cells]]
    logprobs = torch.tensor([[0.0] + [value for _, value in cells]])
    batch = rows_batch(["p" + "".join("g" if g else "e" for g, _ in cells)], [1.0],
                       logprobs=logprobs)
    assert batch["loss_mask"].tolist() == loss_mask
    refused = any(g and v > LOGP_TOLERANCE for g, v in cells)
    try:
        quiet_module = AdvantageModule(ActorConfig(dropped_outcome_reward="ignore", **NO_KL))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quiet_module(batch)
        accepted = True
    except ValueError as err:
        assert "'logprobs': expected log-probabilities" in str(err)
        accepted = False
    assert accepted != refused


@pytest.mark.parametrize("fn", ["token", "turn"])
def test_kernels_accept_every_mask_dtype_and_boundary_values(fn):
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    want = kernel(fn, mask.float(), discount=0.0, gae_lambda=1.0)
    for m in (mask.bool(), mask.int(), mask.double()):
        for got, w in zip(kernel(fn, m, discount=0.0, gae_lambda=1.0), want):
            torch.testing.assert_close(got.float(), w.float())
    kernel(fn, mask.float(), discount=1.0, gae_lambda=torch.tensor([0.0, 1.0]))


# ------------------------------------------------------------------ degenerate reward settings

@pytest.mark.parametrize("settings, key, fragment", [
    ({"reward_clip": 0.0}, "actor.reward_clip", "clips every outcome reward"),
    ({"reward_scaling": 0.0}, "actor.reward_scaling", "scales every outcome reward"),
    ({"overlong_reward_penalty": True, "overlong_tokens": 2, "overlong_penalty_factor": 0.0},
     "actor.overlong_penalty_factor", "0 penalizes nothing"),
    ({"overlong_tokens": 0}, "actor.overlong_tokens", "null or a positive integer"),
    ({"overlong_penalty_factor": -1.0}, "actor.overlong_penalty_factor", ">= 0.0"),
])
def test_degenerate_reward_settings_are_refused(settings, key, fragment):
    with pytest.raises(ValueError) as err:
        ActorConfig(**settings)
    assert str(err.value).startswith(key) and fragment in str(err.value)


def test_a_negative_scaling_and_an_infinite_clip_stay_allowed():
    out = quiet(AdvantageModule(ActorConfig(reward_scaling=-1.0, reward_clip=math.inf, **NO_KL)),
                rows_batch(["pg."], [3.0]))
    close(out["advantages"], [[-3, 0, 0]])


# ------------------------------------------------------------------ settings without effect

def test_lambda_kwargs_with_a_numeric_lambda_warn():
    config, record = caught(ActorConfig, gae_lambda=0.9, gae_lambda_kwargs={"alpha": 0.5})
    [message] = of(record, IgnoredSettingWarning)
    assert message.startswith("actor.gae_lambda_kwargs: {'alpha': 0.5} is ignored")
    assert "actor.gae_lambda is the number 0.9" in message
    assert config.gae_lambda_kwargs == {"alpha": 0.5}


def test_overlong_options_with_the_penalty_off_warn():
    _, record = caught(ActorConfig, overlong_tokens=4, overlong_penalty_factor=1.0)
    messages = of(record, IgnoredSettingWarning)
    assert [m.split(":")[0] for m in messages] == ["actor.overlong_tokens",
                                                   "actor.overlong_penalty_factor"]
    assert all("actor.overlong_reward_penalty is false" in m for m in messages)


def test_a_kl_estimator_without_a_kl_penalty_warns():
    _, record = caught(ActorConfig, kl_ctl=0.0, kl_estimator="k3")
    [message] = of(record, IgnoredSettingWarning)
    assert message.startswith("actor.kl_estimator: 'k3' is ignored: actor.kl_ctl is 0")
    quiet(ActorConfig, kl_ctl=0.0)
    quiet(ActorConfig, kl_ctl=0.1, kl_estimator="k3")


def test_the_shipped_defaults_and_recipes_do_not_warn():
    from lightning_adv.recipes import RECIPES
    quiet(ActorConfig)
    for name, settings in RECIPES.items():
        quiet(ActorConfig, **settings)


@pytest.mark.parametrize("mode", ["gvpo", "process_weighted"])
def test_an_explicit_process_mode_without_token_rewards_warns_once(mode):
    module = AdvantageModule(ActorConfig(advantage={"process_adv_shaping": mode}, **NO_KL))
    out, first = caught(module, two_rows())
    _, second = caught(module, two_rows())
    [message] = of(first, IgnoredSettingWarning)
    assert f"actor.advantage.process_adv_shaping: {mode!r} is ignored" in message
    assert "no 'token_rewards'" in message and not of(second, IgnoredSettingWarning)
    quiet(module, two_rows(token_rewards=torch.full((2, 4), 0.5)))
    quiet(AdvantageModule(ActorConfig(advantage={"process_adv_shaping": "additive"}, **NO_KL)),
          two_rows())
